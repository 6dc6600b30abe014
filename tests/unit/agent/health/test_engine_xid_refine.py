"""XIDs whose message decides the verdict (XID 154, NVLink5 144-150) reach the same verdict
whichever source reports first: NVML's event has no message, the kernel line does. Also the
MIG instance on the condition and a later, worse report of the same XID."""

# ruff: noqa: E501  (real driver lines are long)

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gpuhealth.agent.health.engine import DUPLICATE_XIDS, REFINED_XIDS
from gpuhealth.agent.health.recovery_action import describe
from gpuhealth.agent.observations import PciAddress
from tests.unit.agent.health.test_engine import PCI0, U0, World

_154 = "GPU recovery action changed from 0x0 (None) to "


@dataclass(frozen=True)
class Report:
    source: str
    message: str = ""


NVML = Report("nvml")


@dataclass(frozen=True)
class Case:
    name: str
    xid: int
    reports: tuple[Report, ...]
    state: str
    action: str | None
    """The XID condition's action, None when the GPU keeps no condition for it."""


CASES = [
    Case(
        "154 reboot",
        154,
        (NVML, Report("kmsg", _154 + "0x2 (Node Reboot Required)")),
        "unhealthy",
        "RESTART_BM",
    ),
    Case(
        "154 OS reboot (R610)",
        154,
        (NVML, Report("kmsg", _154 + "0x2 (OS Reboot)")),
        "unhealthy",
        "RESTART_BM",
    ),
    Case(
        "154 gpu reset",
        154,
        (NVML, Report("kmsg", _154 + "0x1 (GPU Reset Required)")),
        "unhealthy",
        "RESET_GPU",
    ),
    Case(
        "154 drain p2p",
        154,
        (NVML, Report("kmsg", _154 + "0x3 (Drain P2P)")),
        "degraded",
        "DRAIN_P2P",
    ),
    Case(
        "154 drain and reset",
        154,
        (NVML, Report("kmsg", _154 + "0x4 (Drain and Reset)")),
        "unhealthy",
        "RESET_GPU",
    ),
    Case(
        "154 back to none",
        154,
        (
            NVML,
            Report(
                "kmsg", "GPU recovery action changed from 0x2 (Node Reboot Required) to 0x0 (None)"
            ),
        ),
        "healthy",
        None,
    ),
    Case(
        "154 undecodable both",
        154,
        (NVML, Report("kmsg", "something new")),
        "degraded",
        "FOLLOW_MESSAGE",
    ),
    Case(
        "154 nvml with its field",
        154,
        (Report("nvml", describe(2)), Report("kmsg", _154 + "0x2 (Node Reboot Required)")),
        "unhealthy",
        "RESTART_BM",
    ),
    Case(
        "154 nvml says more than the kernel",
        154,
        (Report("nvml", describe(1)), Report("kmsg", "something new")),
        "unhealthy",
        "RESET_GPU",
    ),
    Case(
        "145 nonfatal",
        145,
        (
            NVML,
            Report(
                "kmsg",
                "RLW_SRC_TRACK Nonfatal XC1 i0 Link 17 (0x04084507 0x00000004 0x00000000 0x00000000",
            ),
        ),
        "healthy",
        None,
    ),
    Case(
        "145 fatal",
        145,
        (
            NVML,
            Report("kmsg", "RLW_SRC_TRACK Fatal XC1 i0 Link 17 (0x04084507 0x00000001 0x0 0x0)"),
        ),
        "unhealthy",
        "RESET_GPU",
    ),
    Case(
        "149 link down ignore",
        149,
        (
            NVML,
            Report("kmsg", "NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x026001c6 0x00000000 0x0 0x0)"),
        ),
        "healthy",
        None,
    ),
    Case(
        "79 plain duplicate",
        79,
        (NVML, Report("kmsg", "GPU has fallen off the bus.")),
        "unhealthy",
        "RESTART_BM",
    ),
]


def run(case: Case, order: tuple[Report, ...]) -> World:
    w = World()
    for r in order:
        w.xid(
            case.xid,
            source=r.source,
            msg=r.message,
            pci=PciAddress.parse(PCI0),
        )
        w.clock.advance(0.5)  # within health.xid_dedup_window_s
    return w


def xid_condition(w: World, xid: int) -> tuple[str, str | None]:
    conds = [c for c in w.gpu0.conditions if c.code == f"xid-{xid}"]
    return (w.gpu0.state, conds[0].action if conds else None)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_verdict_does_not_depend_on_arrival_order(case: Case) -> None:
    forward = run(case, case.reports)
    backward = run(case, tuple(reversed(case.reports)))
    assert xid_condition(forward, case.xid) == (case.state, case.action)
    assert xid_condition(backward, case.xid) == (case.state, case.action)
    # one event, counted once either way, under the action it named
    for w in (forward, backward):
        assert w.engine.xid_counts() == {(U0, case.xid): 1}
        assert sum(w.engine.counters.value(c) for c in (DUPLICATE_XIDS, REFINED_XIDS)) == 1


def test_the_refinement_keeps_the_first_since_and_is_counted() -> None:
    w = World()
    w.xid(154, source="nvml", pci=PciAddress.parse(PCI0))
    first = next(c for c in w.gpu0.conditions if c.code == "xid-154")
    w.clock.advance(1.0)
    w.xid(154, source="kmsg", msg=_154 + "0x2 (Node Reboot Required)", pci=PciAddress.parse(PCI0))
    (cond,) = [c for c in w.gpu0.conditions if c.code == "xid-154"]
    assert (cond.action, cond.severity, cond.since) == ("RESTART_BM", "unhealthy", first.since)
    assert w.engine.counters.value(REFINED_XIDS) == 1
    assert w.engine.xid_action_counts() == {(U0, 154, "RESTART_BM"): 1}
    assert w.engine.latched()[U0][0].action == "RESTART_BM"  # saved for a restart as refined


def test_a_later_worse_report_of_the_same_xid_raises_the_action() -> None:
    w = World()
    w.xid(154, source="kmsg", msg=_154 + "0x3 (Drain P2P)", pci=PciAddress.parse(PCI0))
    assert xid_condition(w, 154) == ("degraded", "DRAIN_P2P")
    w.clock.advance(60)
    w.xid(
        154,
        source="kmsg",
        msg="GPU recovery action changed from 0x3 (Drain P2P) to 0x2 (Node Reboot Required)",
        pci=PciAddress.parse(PCI0),
    )
    assert xid_condition(w, 154) == ("unhealthy", "RESTART_BM")
    w.clock.advance(60)  # a milder one later never lowers a latched verdict
    w.xid(
        154,
        source="kmsg",
        msg="GPU recovery action changed from 0x2 (Node Reboot Required) to 0x3 (Drain P2P)",
        pci=PciAddress.parse(PCI0),
    )
    assert xid_condition(w, 154) == ("unhealthy", "RESTART_BM")
    assert w.engine.xid_action_counts() == {
        (U0, 154, "DRAIN_P2P"): 2,
        (U0, 154, "RESTART_BM"): 1,
    }


def test_nonfatal_nvlink5_xids_are_counted_not_raised() -> None:
    w = World()
    for _ in range(3):
        w.xid(
            145,
            source="kmsg",
            msg="RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001)",
            pci=PciAddress.parse(PCI0),
        )
        w.clock.advance(5)
    assert w.gpu0.state == "healthy" and not w.gpu0.conditions
    assert w.engine.xid_action_counts() == {(U0, 145, "IGNORE"): 3}


def test_a_nonfatal_line_the_sheet_calls_fatal_taints_soft_until_a_second_signal_agrees() -> None:
    """SAW_MVB status 0x2 is RESET_GPU in NVIDIA's sheet; the driver said Nonfatal. The GPU is
    degraded (soft), not unhealthy; the driver's own Fatal report of the XID makes it so."""
    w = World()
    nonfatal = "SAW_MVB Nonfatal XC0 i0 Link 00 (0x00000021 0x00000002 0x00000000 0x00000000)"
    w.xid(144, source="kmsg", msg=nonfatal, pci=PciAddress.parse(PCI0))
    (cond,) = w.gpu0.conditions
    assert (w.gpu0.state, cond.action) == ("degraded", "RUN_DIAGNOSTICS")
    assert "the driver says Nonfatal" in cond.message
    w.clock.advance(5)
    w.xid(144, source="kmsg", msg=nonfatal.replace("Nonfatal", "Fatal"), pci=PciAddress.parse(PCI0))
    (cond,) = w.gpu0.conditions
    assert (w.gpu0.state, cond.action) == ("unhealthy", "RESET_GPU")


def test_mig_instance_is_on_the_condition() -> None:
    w = World()
    w.xid(
        95,
        source="kmsg",
        msg="Uncontained: LTC TAG (0x2,0x1). RST: Yes, D-RST: No",
        pci=PciAddress.parse(PCI0),
        gpu_instance=5,
        compute_instance=1,
    )
    (cond,) = w.gpu0.conditions
    assert (cond.code, cond.gpu_instance, cond.compute_instance) == ("xid-95", 5, 1)
    assert "MIG GPU instance 5, compute instance 1" in cond.message
    w.xid(
        48, source="kmsg", msg="DBE", pci=PciAddress.parse(PCI0)
    )  # a whole-GPU XID names no instance
    assert next(c for c in w.gpu0.conditions if c.code == "xid-48").gpu_instance is None
