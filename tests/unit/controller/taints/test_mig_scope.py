"""The scope of an unhealthy GPU's device taints: GPU-wide or confined to MIG instances."""

from __future__ import annotations

import pytest

from gpuhealth.controller.fleet.health import GpuHealth
from gpuhealth.controller.taints.mig_scope import confined, instance_devices
from gpuhealth.controller.taints.policy import device_verdict
from gpuhealth.protocol import Condition, MigDeviceInfo

MIGS = (
    MigDeviceInfo(uuid="MIG-a", gpu_instance_id=1, compute_instance_id=0),
    MigDeviceInfo(uuid="MIG-b", gpu_instance_id=2, compute_instance_id=0),
    MigDeviceInfo(uuid="MIG-b2", gpu_instance_id=2, compute_instance_id=1),
    MigDeviceInfo(uuid="MIG-c", gpu_instance_id=9, compute_instance_id=0),
)


def _c(
    code: str,
    action: str,
    gi: int | None = None,
    severity: str = "unhealthy",
    ci: int | None = None,
) -> Condition:
    return Condition(
        reason="XidError",
        code=code,
        severity=severity,  # type: ignore[arg-type]
        action=action,
        gpu_instance=gi,
        compute_instance=ci,
    )


# an XID the driver attributed to GPU instance 2 whose action restarts only the application
GI2_APP = _c("xid-900", "RESTART_APP", 2)


@pytest.mark.parametrize(
    ("conditions", "instances", "devices"),
    [
        pytest.param((_c("xid-79", "RESTART_BM"),), None, (), id="gpu-fault"),
        pytest.param((_c("xid-95", "RESET_GPU", 2),), None, (), id="instance-named-gpu-reset"),
        pytest.param((_c("xid-48", "RESET_GPU", 2, ci=0),), None, (), id="dbe-in-instance"),
        pytest.param((GI2_APP,), {2}, ("MIG-b", "MIG-b2"), id="confined-every-ci-of-the-gi"),
        pytest.param(
            (_c("xid-900", "RESTART_APP", 2, ci=1),), {2}, ("MIG-b", "MIG-b2"), id="ci-named"
        ),
        pytest.param(
            (GI2_APP, _c("xid-901", "IGNORE", 9)),
            {2, 9},
            ("MIG-b", "MIG-b2", "MIG-c"),
            id="two-instances",
        ),
        pytest.param((GI2_APP, _c("ecc-dbe", "RESET_GPU")), None, (), id="plus-a-gpu-fault"),
        pytest.param(
            (GI2_APP, _c("thermal", "CHECK_COOLING", severity="degraded")),
            {2},
            ("MIG-b", "MIG-b2"),
            id="degraded-conditions-do-not-widen",
        ),
        pytest.param((_c("xid-900", "RESTART_APP", 5),), {5}, (), id="unknown-instance"),
        pytest.param(
            (GI2_APP, _c("xid-900", "RESTART_APP", 5)), {2, 5}, (), id="one-instance-unknown"
        ),
        pytest.param((), None, (), id="no-conditions"),
        pytest.param(
            (_c("thermal", "CHECK_COOLING", 2, severity="degraded"),),
            None,
            (),
            id="nothing-unhealthy",
        ),
    ],
)
def test_scope(
    conditions: tuple[Condition, ...], instances: set[int] | None, devices: tuple[str, ...]
) -> None:
    got = confined(conditions)  # the GPU instances it is confined to
    assert (None if got is None else {gi for gi, _ in got}) == instances
    assert instance_devices(conditions, MIGS) == devices


def test_device_verdict_carries_the_agents_mig_devices() -> None:
    gpu = GpuHealth(1, "GPU-1", "unhealthy", (GI2_APP,), mig_devices=MIGS)
    v = device_verdict(gpu)
    assert (v.uuid, v.index, v.code) == ("GPU-1", 1, "xid-900")
    assert v.mig_uuids == ("MIG-a", "MIG-b", "MIG-b2", "MIG-c")
    assert v.instances == ("MIG-b", "MIG-b2")
    wide = device_verdict(GpuHealth(1, "GPU-1", "unhealthy", (_c("xid-79", "RESTART_BM"),), MIGS))
    assert wide.instances == () and wide.mig_uuids == v.mig_uuids
    plain = device_verdict(GpuHealth(0, "GPU-0", "unhealthy", (_c("xid-79", "RESTART_BM"),)))
    assert plain.mig_uuids == () and plain.instances == ()


def _op(
    scope: str | None, gi: int | None = None, ci: int | None = None, action: str = "RESET_GPU"
) -> Condition:
    """An operational event's condition with the driver's impact scope."""
    return Condition(
        reason="OperationalEvent",
        code="op-event",
        severity="unhealthy",
        action=action,
        gpu_instance=gi,
        compute_instance=ci,
        scope=scope,
    )


@pytest.mark.parametrize(
    ("conditions", "devices"),
    [
        pytest.param((_op("gpu", 2, action="RESTART_APP"),), (), id="gpu-scope-wins-over-action"),
        pytest.param((_op("gpu-instance", 2),), ("MIG-b", "MIG-b2"), id="gi-scope-every-ci"),
        pytest.param((_op("gpu-instance", 2, 1),), ("MIG-b", "MIG-b2"), id="gi-scope-ignores-ci"),
        pytest.param((_op("compute-instance", 2, 1),), ("MIG-b2",), id="ci-scope-one-device"),
        pytest.param((_op("compute-instance", 2),), ("MIG-b", "MIG-b2"), id="ci-scope-no-ci-id"),
        pytest.param((_op("compute-instance", 2, 7),), (), id="ci-scope-unknown-ci"),
        pytest.param((_op("gpu-instance"),), (), id="instance-scope-without-ids"),
        pytest.param((_op("nvlink-domain", 2),), (), id="nvlink-domain-gpu-wide"),
        pytest.param((_op("node", 2),), (), id="node-gpu-wide"),
        pytest.param(
            (_op("compute-instance", 2, 1), _op("gpu-instance", 9)),
            ("MIG-b2", "MIG-c"),
            id="two-scoped-conditions",
        ),
        pytest.param(
            (_op("compute-instance", 2, 1), _c("xid-79", "RESTART_BM")), (), id="plus-gpu-fault"
        ),
        pytest.param((_op("gpu-instance", 2), GI2_APP), ("MIG-b", "MIG-b2"), id="scope-and-xid"),
        pytest.param((_op(None, 2),), (), id="no-scope-action-rule"),
    ],
)
def test_driver_scope(conditions: tuple[Condition, ...], devices: tuple[str, ...]) -> None:
    assert instance_devices(conditions, MIGS) == devices
