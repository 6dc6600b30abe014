"""Policy: GPU states + settings -> desired taints, labels, condition (table-driven)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpuhealth.controller.fleet.health import GpuHealth, NodeHealth
from gpuhealth.controller.names import Keys
from gpuhealth.controller.taints.policy import Taint, desired_node, gpu_code
from gpuhealth.controller.taints.settings import PolicySettings
from gpuhealth.protocol import Condition

K = Keys("gpuhealth.io")
XID79 = Condition(reason="XidError", code="xid-79", severity="unhealthy", message="fell off")
DBE = Condition(reason="EccUncorrectable", code="ecc-dbe", severity="unhealthy")
HOT = Condition(reason="ThermalSlowdown", code="thermal", severity="degraded")


def gpu(i: int, state: str = "healthy", *conds: Condition) -> GpuHealth:
    return GpuHealth(index=i, uuid=f"GPU-{i}", state=state, conditions=tuple(conds))  # type: ignore[arg-type]


def node(*gpus: GpuHealth, reporting: str = "ok", missing: int = 0) -> NodeHealth:
    return NodeHealth(name="n1", reporting=reporting, gpus=gpus, gpus_missing=missing)  # type: ignore[arg-type]


NS = "NoSchedule"
PNS = "PreferNoSchedule"
NE = "NoExecute"

CASES = [
    # (id, health, settings, expected taints, state, condition status, condition reason)
    (
        "all-healthy",
        node(gpu(0), gpu(1)),
        PolicySettings(),
        set(),
        "healthy",
        "True",
        "AllGPUsHealthy",
    ),
    (
        "one-unhealthy",
        node(gpu(0), gpu(1, "unhealthy", XID79)),
        PolicySettings(),
        {Taint(K.unhealthy_taint, "xid-79", NS)},
        "unhealthy",
        "False",
        "XidError",
    ),
    (
        "degraded-prefer",
        node(gpu(0, "degraded", HOT), gpu(1)),
        PolicySettings(),
        {Taint(K.degraded_taint, "thermal", PNS)},
        "degraded",
        "True",
        "GPUDegraded",
    ),
    (
        "degraded-taint-off",
        node(gpu(0, "degraded", HOT)),
        PolicySettings(degraded_taint=False),
        set(),
        "degraded",
        "True",
        "GPUDegraded",
    ),
    (
        "unhealthy-wins-over-degraded",
        node(gpu(0, "degraded", HOT), gpu(1, "unhealthy", DBE)),
        PolicySettings(),
        {Taint(K.unhealthy_taint, "ecc-dbe", NS)},
        "unhealthy",
        "False",
        "EccUncorrectable",
    ),
    (
        "lowest-index-names-the-taint",
        node(gpu(3, "unhealthy", DBE), gpu(1, "unhealthy", XID79)),
        PolicySettings(),
        {Taint(K.unhealthy_taint, "ecc-dbe", NS)},
        "unhealthy",
        "False",
        "EccUncorrectable",
    ),
    (
        "noexecute-configured",
        node(gpu(0, "unhealthy", XID79)),
        PolicySettings(noexecute_codes=("xid-79",)),
        {Taint(K.unhealthy_taint, "xid-79", NS), Taint(K.unhealthy_taint, "xid-79", NE)},
        "unhealthy",
        "False",
        "XidError",
    ),
    (
        "noexecute-other-code",
        node(gpu(0, "unhealthy", DBE)),
        PolicySettings(noexecute_codes=("xid-79",)),
        {Taint(K.unhealthy_taint, "ecc-dbe", NS)},
        "unhealthy",
        "False",
        "EccUncorrectable",
    ),
    (
        "min-healthy-enough",
        node(gpu(0), gpu(1), gpu(2, "unhealthy", XID79)),
        PolicySettings(unhealthy_policy="min-healthy", min_healthy_gpus=2),
        {Taint(K.degraded_taint, "xid-79", PNS)},
        "unhealthy",
        "False",
        "XidError",
    ),
    (
        "min-healthy-too-few",
        node(gpu(0), gpu(1, "unhealthy", XID79), gpu(2, "unhealthy", DBE)),
        PolicySettings(unhealthy_policy="min-healthy", min_healthy_gpus=2),
        {Taint(K.unhealthy_taint, "xid-79", NS)},
        "unhealthy",
        "False",
        "XidError",
    ),
    (
        "unknown-gpu-is-soft",
        node(gpu(0, "unknown"), gpu(1)),
        PolicySettings(),
        {Taint(K.degraded_taint, "gpu-unknown", PNS)},
        "unknown",
        "True",
        "GPUDegraded",
    ),
    (
        "unknown-outranks-degraded",
        node(gpu(0, "degraded", HOT), gpu(1, "unknown")),
        PolicySettings(),
        {Taint(K.degraded_taint, "thermal", PNS)},
        "unknown",
        "True",
        "GPUDegraded",
    ),
    ("no-gpus", node(), PolicySettings(), set(), "healthy", "True", "AllGPUsHealthy"),
    (
        "gpu-missing-healthy-rest",
        node(gpu(0), gpu(1), missing=1),
        PolicySettings(),
        {Taint(K.unhealthy_taint, "gpu-missing", NS)},
        "unhealthy",
        "False",
        "GpuMissing",
    ),
    (
        "gpu-missing-every-gpu",
        node(missing=8),
        PolicySettings(),
        {Taint(K.unhealthy_taint, "gpu-missing", NS)},
        "unhealthy",
        "False",
        "GpuMissing",
    ),
    (
        "gpu-missing-and-a-broken-gpu-keeps-the-gpu-code",
        node(gpu(0, "unhealthy", XID79), gpu(1), missing=1),
        PolicySettings(),
        {Taint(K.unhealthy_taint, "xid-79", NS)},
        "unhealthy",
        "False",
        "XidError",
    ),
    (
        "gpu-missing-evicts-when-configured",
        node(gpu(0), missing=1),
        PolicySettings(noexecute_codes=("gpu-missing",)),
        {Taint(K.unhealthy_taint, "gpu-missing", NS), Taint(K.unhealthy_taint, "gpu-missing", NE)},
        "unhealthy",
        "False",
        "GpuMissing",
    ),
    (
        "gpu-missing-min-healthy-enough-left",
        node(gpu(0), gpu(1), missing=1),
        PolicySettings(unhealthy_policy="min-healthy", min_healthy_gpus=2),
        {Taint(K.degraded_taint, "gpu-missing", PNS)},
        "unhealthy",
        "False",
        "GpuMissing",
    ),
    (
        "gpu-missing-min-healthy-too-few",
        node(gpu(0), missing=1),
        PolicySettings(unhealthy_policy="min-healthy", min_healthy_gpus=2),
        {Taint(K.unhealthy_taint, "gpu-missing", NS)},
        "unhealthy",
        "False",
        "GpuMissing",
    ),
]


@pytest.mark.parametrize(
    ("health", "settings", "taints", "state", "status", "reason"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_desired_node_state_when_reporting(
    health: NodeHealth,
    settings: PolicySettings,
    taints: set[Taint],
    state: str,
    status: str,
    reason: str,
) -> None:
    d = desired_node(health, settings, K)
    assert set(d.taints) == taints
    assert d.state == state
    assert d.authoritative and d.manage_meta
    assert d.condition is not None
    assert (d.condition.status, d.condition.reason) == (status, reason)
    assert dict(d.labels)[K.state_label] == state


def test_missing_gpu_condition_quotes_the_agent() -> None:
    said = Condition(
        reason="GpuMissing",
        code="gpu-missing",
        severity="unhealthy",
        message="7 of 8 expected GPUs visible",
    )
    report = NodeHealth(
        name="n1", reporting="ok", gpus=(gpu(0),), gpus_missing=1, node_conditions=(said,)
    )
    d = desired_node(report, PolicySettings(), K)
    assert d.condition is not None
    assert d.condition.message == (
        "1 expected GPU(s) missing (gpu-missing): 7 of 8 expected GPUs visible"
    )
    assert dict(d.labels)[K.healthy_gpus_label] == "1"
    assert d.devices == ()  # a GPU that is gone has no device to taint


def test_labels_and_devices() -> None:
    d = desired_node(
        node(gpu(0), gpu(1, "unhealthy", XID79), gpu(2, "degraded", HOT)), PolicySettings(), K
    )
    assert dict(d.labels) == {K.state_label: "unhealthy", K.healthy_gpus_label: "1"}
    assert [(v.uuid, v.code) for v in d.devices] == [("GPU-1", "xid-79")]
    assert d.condition is not None
    assert "GPU 1 (GPU-1): XidError xid-79 (fell off)" in d.condition.message


def test_condition_message_is_bounded() -> None:
    long = Condition(reason="XidError", code="xid-79", severity="unhealthy", message="x" * 1000)
    d = desired_node(node(*(gpu(i, "unhealthy", long) for i in range(8))), PolicySettings(), K)
    assert d.condition is not None
    assert len(d.condition.message) <= 1024


@pytest.mark.parametrize("taint_silent", [False, True])
def test_silent_agent_holds_taints(taint_silent: bool) -> None:
    d = desired_node(
        node(gpu(0, "unhealthy", XID79), reporting="silent"),
        PolicySettings(taint_on_agent_silent=taint_silent),
        K,
    )
    assert not d.authoritative
    assert d.condition is not None and d.condition.status == "Unknown"
    assert d.condition.reason == "AgentNotReporting"
    assert dict(d.labels) == {K.state_label: "unknown"}
    expected = {Taint(K.unhealthy_taint, "agent-silent", NS)} if taint_silent else set()
    assert set(d.taints) == expected


def test_no_data_writes_nothing_and_removes_nothing() -> None:
    d = desired_node(node(reporting="no-data"), PolicySettings(), K)
    assert not d.authoritative and not d.manage_meta and not d.taints


def test_excluded_wants_no_taints_and_no_meta() -> None:
    d = desired_node(node(gpu(0, "unhealthy", XID79)), PolicySettings(), K, excluded=True)
    assert d.authoritative and not d.manage_meta and not d.taints and not d.devices


def test_custom_prefix() -> None:
    k = Keys("example.com")
    d = desired_node(node(gpu(0, "unhealthy", XID79)), PolicySettings(), k)
    assert {t.key for t in d.taints} == {"example.com/unhealthy"}
    assert k.owns("example.com/degraded") and not k.owns("gpuhealth.io/degraded")


def test_gpu_code_fallback() -> None:
    assert gpu_code(gpu(0, "unhealthy")) == "gpu-unhealthy"
    assert gpu_code(gpu(0, "unhealthy", HOT, XID79)) == "xid-79"


T0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
XID79_T0 = Condition(reason="XidError", code="xid-79", severity="unhealthy", since=T0)
LOST_T1 = Condition(
    reason="GpuLost", code="gpu-lost", severity="unhealthy", since=T0 + timedelta(seconds=1)
)


@pytest.mark.parametrize(
    ("conditions", "code"),
    [
        ((XID79_T0,), "xid-79"),
        ((XID79_T0, LOST_T1), "xid-79"),
        ((LOST_T1, XID79_T0), "xid-79"),  # wire order does not matter: the oldest explains
        ((HOT, LOST_T1), "gpu-lost"),  # only conditions at the GPU's own severity count
        ((), "gpu-unhealthy"),
    ],
)
def test_taint_value_is_the_oldest_condition_at_the_gpus_severity(
    conditions: tuple[Condition, ...], code: str
) -> None:
    assert gpu_code(gpu(0, "unhealthy", *conditions)) == code


QUARANTINE = Taint("gpuhealth.io/remediation", "reset-gpu", NS)


@pytest.mark.parametrize(
    ("report", "excluded", "want", "authoritative"),
    [
        (node(gpu(0), gpu(1)), False, {QUARANTINE}, True),
        (
            node(gpu(0, "unhealthy", XID79)),
            False,
            {QUARANTINE, Taint(K.unhealthy_taint, "xid-79", NS)},
            True,
        ),
        (node(reporting="no-data"), False, {QUARANTINE}, False),
        (node(gpu(0, "unhealthy", XID79)), True, set(), True),
    ],
    ids=["recovered-gpus-stay-quarantined", "with-the-health-taint", "no-data", "excluded"],
)
def test_the_quarantine_taint_joins_the_desired_taints(
    report: NodeHealth, excluded: bool, want: set[Taint], authoritative: bool
) -> None:
    d = desired_node(report, PolicySettings(), K, excluded=excluded, quarantine=QUARANTINE)
    assert set(d.taints) == want
    assert d.authoritative is authoritative
