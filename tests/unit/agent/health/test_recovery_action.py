"""The recovery-action table against nvidia-ml-py's enum and the labels drivers print."""

from __future__ import annotations

import pynvml
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.agent.health import recovery_action as ra


def test_table_matches_pynvml_enum() -> None:
    assert pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION == ra.FIELD_ID
    assert pynvml.nvmlEventTypeGpuRecoveryAction == ra.EVENT_TYPE
    for row in ra.RECOVERY_ACTIONS:
        assert getattr(pynvml, f"NVML_GPU_RECOVERY_ACTION_{row.name}") == row.value
    defined = {v for k, v in vars(pynvml).items() if k.startswith("NVML_GPU_RECOVERY_ACTION_")}
    assert defined == {r.value for r in ra.RECOVERY_ACTIONS}


@pytest.mark.parametrize(
    ("value", "action", "severity", "code"),
    [
        (0, "IGNORE", "healthy", "recovery-none"),
        (1, "RESET_GPU", "unhealthy", "recovery-gpu-reset"),
        (2, "RESTART_BM", "unhealthy", "recovery-node-reboot"),
        (3, "DRAIN_P2P", "degraded", "recovery-drain-p2p"),
        (4, "RESET_GPU", "unhealthy", "recovery-drain-and-reset"),
        (5, "RECOVER_IMEX_DOMAIN", "degraded", "recovery-recover-imex-domain"),
        (6, "RESET_GPU", "unhealthy", "recovery-bus-reset"),
        (7, "RESTART_BM", "unhealthy", "recovery-system-reboot"),
        (99, "CONTACT_SUPPORT", "degraded", "recovery-unknown"),
    ],
)
def test_from_value(value: int, action: str, severity: str, code: str) -> None:
    row = ra.from_value(value)
    assert (row.action, row.severity, row.code) == (action, severity, code)


@pytest.mark.parametrize(
    ("message", "name"),
    [
        # driver lines seen in public reports (kernel_rc.c prints "from 0x.. (..) to 0x.. (..)")
        (
            "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
            "NODE_REBOOT",
        ),
        ("GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", "GPU_RESET"),
        ("GPU recovery action changed from 0x0 (None) to 0x2 (OS Reboot)", "NODE_REBOOT"),
        ("GPU recovery action changed from 0x0 (None) to 0x1 (PF FLR)", "GPU_RESET"),
        ("GPU recovery action changed from 0x0 (None) to 0x1 (Drain and Reset)", "DRAIN_AND_RESET"),
        ("GPU recovery action changed from 0x0 (None) to 0x4 (Drain P2P)", "DRAIN_P2P"),
        ("GPU recovery action changed from 0x2 (Node Reboot Required) to 0x0 (None)", "NONE"),
        ("GPU recovery action (NVML) is 0x7 (System Reboot)", "SYSTEM_REBOOT"),
    ],
)
def test_parse_message_by_label_not_number(message: str, name: str) -> None:
    row = ra.parse_message(message)
    assert row is not None and row.name == name


def test_describe_round_trips() -> None:
    for row in ra.RECOVERY_ACTIONS:
        assert ra.parse_message(ra.describe(row.value)) == row
    assert ra.parse_message(ra.describe(42)) is None  # "unknown" names no row


@pytest.mark.parametrize("label", ["Reset", "Reboot", "Drain P2P", "Drain and Reset", "None"])
def test_nvidia_smi_labels(label: str) -> None:
    assert ra.from_label(label) is not None


@given(st.text(max_size=200))
def test_parse_message_never_raises(message: str) -> None:
    ra.parse_message(message)
