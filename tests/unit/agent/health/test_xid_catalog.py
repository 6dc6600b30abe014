# ruff: noqa: E501  (real driver lines are long)
"""The XID catalog data and the verdict rules of DESIGN.md "Health model"."""

from __future__ import annotations

import re

import pytest

from gpuhealth.agent.health import recovery_action
from gpuhealth.agent.health.xid_catalog import catalog, classify, load, lookup

LABEL = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


def test_every_code_of_the_ampere_catalog_is_there() -> None:
    cat = catalog()
    assert set(cat) == set(range(1, 173))
    for info in cat.values():
        assert info.name and info.description and info.category and info.action
        assert info.severity in {"healthy", "degraded", "unhealthy"}


@pytest.mark.parametrize(
    ("xid", "severity", "action"),
    [
        (13, "healthy", "RESTART_APP"),
        (31, "healthy", "RESTART_APP"),
        (43, "healthy", "IGNORE"),
        (45, "healthy", "IGNORE"),
        (63, "healthy", "IGNORE"),
        (94, "healthy", "RESTART_APP"),
        (48, "unhealthy", "RESET_GPU"),
        (62, "unhealthy", "RESET_GPU"),
        (64, "unhealthy", "RESET_GPU"),
        (74, "unhealthy", "RESET_GPU"),
        (79, "unhealthy", "RESTART_BM"),
        (95, "unhealthy", "RESET_GPU"),
        (109, "unhealthy", "RESET_GPU"),
        (119, "unhealthy", "RESET_GPU"),
        (120, "unhealthy", "RESET_GPU"),
        (140, "unhealthy", "RESET_GPU"),
        (143, "unhealthy", "RESET_GPU"),
        (145, "unhealthy", "RESET_GPU"),  # no message (NVML): the conservative row
        (151, "unhealthy", "RESTART_VM"),
        (54, "unhealthy", "CHECK_MECHANICALS"),
        (78, "degraded", "UPDATE_SWFW"),
        (2, "degraded", "CONTACT_SUPPORT"),
        (154, "degraded", "FOLLOW_MESSAGE"),
        (500, "degraded", "CONTACT_SUPPORT"),
    ],
)
def test_verdicts(xid: int, severity: str, action: str) -> None:
    v = classify(xid)
    assert (v.severity, v.action) == (severity, action)
    assert v.code == f"xid-{xid}" and LABEL.match(v.code)
    assert v.reason == ("XidError" if lookup(xid) else "UnknownXid")


def test_catalog_actions_map_to_severities() -> None:
    for info in catalog().values():
        if info.category == "unused":
            assert info.severity == "degraded"
        elif info.catalog_action in ("IGNORE", "RESTART_APP"):
            assert info.severity == "healthy", info
        elif info.catalog_action in ("RESET_GPU", "RESTART_BM", "RESTART_VM", "CONTACT_SUPPORT"):
            assert info.severity == "unhealthy", info
        elif info.catalog_action is None:
            assert info.note, info  # gpuhealth's own choice is explained


def test_application_faults_are_flagged_for_escalation() -> None:
    assert all(classify(x).application for x in (13, 31, 43, 45))
    assert not classify(79).application and not classify(63).application


_154 = "GPU recovery action changed from 0x0 (None) to "


@pytest.mark.parametrize(
    ("message", "severity", "action"),
    [
        (_154 + "0x2 (Node Reboot Required)", "unhealthy", "RESTART_BM"),
        (_154 + "0x2 (OS Reboot)", "unhealthy", "RESTART_BM"),  # R610 wording
        (_154 + "0x1 (GPU Reset Required)", "unhealthy", "RESET_GPU"),
        (_154 + "0x1 (PF FLR)", "unhealthy", "RESET_GPU"),
        (_154 + "0x3 (Drain P2P)", "degraded", "DRAIN_P2P"),
        (_154 + "0x4 (Drain and Reset)", "unhealthy", "RESET_GPU"),
        (_154 + "0x6 (Bus Reset)", "unhealthy", "RESET_GPU"),
        (_154 + "0x7 (System Reboot)", "unhealthy", "RESTART_BM"),
        (
            "GPU recovery action changed from 0x2 (Node Reboot Required) to 0x0 (None)",
            "healthy",
            "IGNORE",
        ),
        # the NVML source's text for its XID 154 event (it reads the field with the event)
        ("GPU recovery action (NVML) is 0x2 (Node Reboot Required)", "unhealthy", "RESTART_BM"),
        (_154 + "0x9 (Unheard Of)", "degraded", "FOLLOW_MESSAGE"),
        ("something else entirely", "degraded", "FOLLOW_MESSAGE"),
        ("", "degraded", "FOLLOW_MESSAGE"),
    ],
)
def test_xid_154_follows_its_message(message: str, severity: str, action: str) -> None:
    v = classify(154, message)
    assert (v.severity, v.action) == (severity, action)
    assert v.decoded == (action != "FOLLOW_MESSAGE")


@pytest.mark.parametrize("row", recovery_action.RECOVERY_ACTIONS, ids=lambda r: r.name)
def test_xid_154_knows_every_recovery_action_nvml_defines(
    row: recovery_action.RecoveryAction,
) -> None:
    """Every value of nvmlDeviceGpuRecoveryAction_t, as the kernel and the NVML source word it."""
    for message in (f"{_154}0x{row.value:x} ({row.label})", recovery_action.describe(row.value)):
        v = classify(154, message)
        assert (v.severity, v.action, v.decoded) == (row.severity, row.action, True)


def test_h100_applicability() -> None:
    assert "H100" in catalog()[79].applies
    assert catalog()[1].applies == ()


@pytest.mark.parametrize(
    ("xid", "message", "severity", "action"),
    [
        # NVIDIA/NVSentinel#1357: the kernel said Nonfatal, a DCGM diag called it fatal
        (
            145,
            "RLW_SRC_TRACK Nonfatal XC1 i0 Link 17 (0x04084507 0x00000004 0x00000000 0x00000000 0x00000000 0x00000000",
            "healthy",
            "XID_154_EVAL",
        ),
        (
            145,
            "RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)",
            "healthy",
            "IGNORE",
        ),
        (
            144,
            "SAW_MVB Nonfatal XC0 i0 Link 0 (0x00000001 0x00000008 0x00000000 0x00000000 0x00000000 0x00000000)",
            "healthy",
            "IGNORE",
        ),
        # the sheet calls SAW_MVB status 0x2 fatal, the driver says Nonfatal: the table alone
        # does not taint hard (soft until a second signal agrees)
        (
            144,
            "SAW_MVB Nonfatal XC0 i0 Link 00 (0x00000021 0x00000002 0x00000000 0x00000000)",
            "degraded",
            "RUN_DIAGNOSTICS",
        ),
        (  # NVSwitch's spelling of the word
            144,
            "SAW_MVB Non-fatal XC0 i0 Link 00 (0x00000021 0x00000002 0x00000000 0x00000000)",
            "degraded",
            "RUN_DIAGNOSTICS",
        ),
        (  # the driver agrees with the sheet
            144,
            "SAW_MVB Fatal XC0 i0 Link 00 (0x00000021 0x00000002 0x00000000 0x00000000)",
            "unhealthy",
            "RESET_GPU",
        ),
        (
            144,
            "SAW_MVB Fatal XC0 i0 Link 00 (0x00000001 0x00000010 0x00000000 0x00000000)",
            "unhealthy",
            "RESET_GPU",
        ),
        # several status bits: the worst row wins
        (
            144,
            "SAW_MVB Nonfatal XC0 i0 Link 00 (0x00000001 0x00000005 0x00000000 0x00000000)",
            "healthy",
            "IGNORE",
        ),
        (
            144,
            "SAW_MVB Fatal XC0 i0 Link 00 (0x00000001 0x00000006 0x00000000 0x00000000)",
            "unhealthy",
            "RESET_GPU",
        ),
        (
            145,
            "RLW_REMAP Fatal XC0 i0 Link 00 (0x00000004 0x00000040 0x00000000 0x00000000)",
            "unhealthy",
            "RESET_GPU",
        ),
        (
            145,
            "RLW_REMAP Nonfatal XC0 i0 Link 00 (0x00000004 0x00000100 0x00000000 0x00000000)",
            "healthy",
            "IGNORE",
        ),
        (
            145,
            "RLW_CTRL Nonfatal XC0 i0 Link 00 (0x00000003 0x80000000 0x00000000 0x00000000)",
            "healthy",
            "IGNORE",
        ),
        (
            146,
            "TLW_RX/TLW_RX_PIPE0 Fatal XC0 i0 Link 00 (0x0000000a 0x00000004 0x00000000 0x00000000)",
            "unhealthy",
            "RESET_GPU",
        ),
        (
            146,
            "TLW_TX Nonfatal XC0 i0 Link 00 (0x0000000c 0x00000002 0x00000000 0x00000000)",
            "healthy",
            "IGNORE",
        ),
        (
            147,
            "TREX Nonfatal XC0 i0 Link 00 (0x0000000e 0x00000001 0x00000000 0x00000000)",
            "healthy",
            "IGNORE",
        ),
        (
            148,
            "NVLPW_CTRL/NVLPW Nonfatal XC0 i0 Link 00 (0x0000000f 0x80000000 0x00000000 0x00000000)",
            "healthy",
            "IGNORE",
        ),
        # NETIR_LINK_EVT: the sub-code (intrinfo bits 20-25) decides
        (
            149,
            "NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x025001c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
            "unhealthy",
            "RESET_GPU",
        ),
        (
            149,
            "NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x026001c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
            "healthy",
            "IGNORE",
        ),
        (
            149,
            "NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
            "unhealthy",
            "RESET_GPU",
        ),
        (
            149,
            "NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
            "unhealthy",
            "RESET_GPU",
        ),
        (
            149,
            "NETIR_BER_EVENT Nonfatal XC0 i0 Link 00 (0x00000013 0x00000003 0x00000000 0x00000000)",
            "healthy",
            "IGNORE",
        ),
        (
            149,
            "NETIR_MFDE_EVENT Nonfatal XC0 i0 Link 00 (0x00000014 0x00000003 0x00000000 0x00000000)",
            "healthy",
            "IGNORE",
        ),
        (
            149,
            "NETIR_MFDE_EVENT Fatal XC0 i0 Link 00 (0x00000014 0x00000005 0x00000000 0x00000000)",
            "unhealthy",
            "RESET_GPU",
        ),
        (
            150,
            "MSE_WATCHDOG Fatal XC0 i0 Link 00 (0x00000000 0x00000000 0x00000000 0x00000000)",
            "unhealthy",
            "RESET_GPU",
        ),
        # not in the sheet: the driver's word decides
        (
            145,
            "RLW_NEWUNIT Nonfatal XC0 i0 Link 00 (0x00000099 0x00000001 0x0 0x0)",
            "healthy",
            "IGNORE",
        ),
        (
            145,
            "RLW_NEWUNIT Fatal XC0 i0 Link 00 (0x00000099 0x00000001 0x0 0x0)",
            "unhealthy",
            "RESET_GPU",
        ),
        (
            149,
            "NETIR_MFDE_EVENT Nonfatal XC0 i0 Link 00 (0x00000014 0x00000006 0x0 0x0)",
            "healthy",
            "IGNORE",
        ),
        # nothing to decode: the conservative row
        (145, "", "unhealthy", "RESET_GPU"),
        (145, "garbage", "unhealthy", "RESET_GPU"),
    ],
)
def test_nvlink5_decode(xid: int, message: str, severity: str, action: str) -> None:
    v = classify(xid, message)
    assert (v.severity, v.action) == (severity, action), v.message
    assert v.code == f"xid-{xid}"


def test_every_nvlink5_row_is_reachable_from_a_message() -> None:
    tables = load().tables
    for (xid, unit), rules in tables.nvlink5.items():
        for r in rules:
            intr = 0 if r.subcode is None else r.subcode << 20
            v = classify(xid, f"{unit} Nonfatal XC0 i0 Link 00 (0x{intr:08x} 0x{r.status:08x} 0x0)")
            assert v.decoded
            assert v.severity == tables.decode_severity[v.action]
