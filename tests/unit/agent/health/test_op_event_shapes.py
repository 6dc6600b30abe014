"""GPU Operational Events in the shapes NVIDIA's own definitions give them, from the agent's
engine to the controller's pure decisions (issue 39, item 4): the driver's scope is honoured,
an unconfirmed scope never narrows a GPU-wide fault, and a preview-only signal never opens an
NVLink domain incident or hard-taints a node.

Where the shapes come from:

- nvidia-ml-py 13.615.71 (``pynvml.py``): ``NVML_OPERATIONAL_EVENT_SEVERITY_RECOVERABLE`` 30,
  ``_FATAL`` 40; ``NVML_OPERATIONAL_EVENT_ATTR_PRIMARY`` ``1 << 5``;
  ``c_nvmlEventSetWait_v3_t.scope``, a ``c_uint`` whose values NVML does not name.
- NVIDIA's open GPU kernel modules 615.71.09: ``nvlink_event_defs.h``
  (``NVLINK_OP_EVENT_CODE_ALI_TRAINING_FAILURE`` 0x0001, ``_MSE_DEGRADED`` 0x0002,
  ``_MSE_WATCHDOG_TIMEOUT`` 0x0003, ``_SW_LINK_DOWN`` 0x0004); ``g_nvlink_events_nvoc.c``:
  every NVLink event is a ``GpuInterconnectError`` (category INTERCONNECT_ERROR, 0x0003) of
  module ``GPU-NVLINK``, built with ``GPU_OPERATIONAL_EVENT_SCOPE_DEVICE`` (its value is not
  published) and attribute bit 5 (PRIMARY), without a legacy Xid context. ``cl90d0.h``:
  ``NV_OPERATIONAL_EVENT_BUFFER_SCOPE_DEVICE`` 0, ``_MIG_GPU_INSTANCE`` 1,
  ``_MIG_COMPUTE_INSTANCE`` 2 is the *subscription's* enum ("MIG scopes are ABI-defined for
  planned support").
- The kernel's MIG Xid line (``kernel_rc.c``): ``NVRM: Xid (PCI:0000:1b:00 GPU-I:05): 95, ...``;
  Xid 95 (uncontained ECC) calls for RESET_GPU.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from gpuhealth.agent.observations import OperationalEventObservation, PciAddress, XidObservation
from gpuhealth.agent.sources.kmsg.parser import parse_line
from gpuhealth.controller.fleet.health import GpuHealth, NodeHealth
from gpuhealth.controller.incidents.domain_settings import DomainSettings
from gpuhealth.controller.incidents.domains import NodeFabric, fabric_fault, judge_domains
from gpuhealth.controller.names import Keys
from gpuhealth.controller.remediation.fault import scoped_action
from gpuhealth.controller.taints.mig_scope import instance_devices
from gpuhealth.controller.taints.policy import desired_node, device_verdict
from gpuhealth.controller.taints.settings import PolicySettings
from gpuhealth.protocol import Condition, MigDeviceInfo
from tests.unit.agent.health.test_engine import U0, World

RECOVERABLE, FATAL = 30, 40
PRIMARY = 1 << 5
INTERCONNECT_ERROR = 0x0003
NVLINK_CODES = {
    "ALI_TRAINING_FAILURE": 0x0001,
    "MSE_DEGRADED": 0x0002,
    "MSE_WATCHDOG_TIMEOUT": 0x0003,
    "SW_LINK_DOWN": 0x0004,
}
DOMAIN = "5f0c7e1a-2b3c-4d5e-8f90-a1b2c3d4e5f6.7"
MIGS = (
    MigDeviceInfo(uuid="MIG-5-0", gpu_instance_id=5, compute_instance_id=0),
    MigDeviceInfo(uuid="MIG-6-0", gpu_instance_id=6, compute_instance_id=0),
)


def nvlink_event(w: World, code: int, severity: int, scope: int = 0, **kw: Any) -> None:
    """An NVLink event as the R615 driver builds it (no legacy Xid)."""
    w.transitions += w.engine.observe(
        OperationalEventObservation(
            source="nvml",
            at=w.clock.now(),
            uuid=U0,
            module="GPU-NVLINK",
            code=code,
            category=INTERCONNECT_ERROR,
            severity=severity,
            scope=scope,
            attributes=PRIMARY,
            **kw,
        )
    )


def conditions(w: World) -> dict[str, Condition]:
    return {c.code: c for c in w.gpu0.conditions}


@pytest.mark.parametrize("name", NVLINK_CODES)
@pytest.mark.parametrize("severity", [RECOVERABLE, FATAL])
def test_an_nvlink_event_the_driver_scopes_to_the_device_stays_the_gpus(
    name: str, severity: int
) -> None:
    """Before: every GPU-NVLINK event was judged ``nvlink-domain`` whatever the driver said."""
    w = World()
    nvlink_event(w, NVLINK_CODES[name], severity)
    c = conditions(w)[f"goe-gpu-nvlink-0x{NVLINK_CODES[name]:04x}"]
    assert c.scope == "gpu" and "scope gpu" in c.message
    assert c.severity == "degraded" and w.gpu0.state == "degraded"


@pytest.mark.parametrize("raw", [0, 1, 2, 7])
def test_no_raw_scope_value_makes_an_nvlink_event_the_domains(raw: int) -> None:
    """Whatever number DEVICE turns out to be, the module never widens the driver's scope, and
    an unconfirmed narrower one is not put on the condition."""
    w = World()
    nvlink_event(w, NVLINK_CODES["SW_LINK_DOWN"], FATAL, scope=raw)
    (c,) = w.gpu0.conditions
    assert c.scope in ("gpu", None)


def test_two_trays_with_recoverable_nvlink_events_taint_no_rack() -> None:
    """Two trays of one NVL72 rack each report a RECOVERABLE NVLink event without a legacy Xid
    (a preview-only, degraded signal), 30 s apart. Before: an NVLink domain incident (every tray
    of the rack tainted). Now: no incident, and neither node is hard-tainted."""
    nodes, health = [], []
    for i in range(2):
        w = World()
        w.clock.advance(30.0 * i)
        nvlink_event(w, NVLINK_CODES["MSE_DEGRADED"], RECOVERABLE)
        st = w.gpu0
        assert st.state == "degraded"
        since, code = fabric_fault(st.conditions, [], DomainSettings(), w.clock.now())
        assert (since, code) == (None, "")
        nodes.append(NodeFabric(f"tray{i}", DOMAIN, since, code))
        health.append(
            NodeHealth(
                f"tray{i}",
                "ok",
                gpus=(GpuHealth(0, U0, st.state, tuple(st.conditions)),),
            )
        )
    nodes += [NodeFabric(f"tray{i}", DOMAIN) for i in range(2, 18)]
    (verdict,) = judge_domains(nodes, set(), DomainSettings())
    assert not verdict.incident and verdict.faulty == ()
    for report in health:
        desired = desired_node(report, PolicySettings(), Keys("gpuhealth.io"))
        assert not any(t.hard for t in desired.taints), desired.taints
        assert not desired.devices  # no DRA device taint either


def test_an_older_agents_domain_scoped_preview_signal_opens_no_incident() -> None:
    """The same two trays as reported by an agent from before this change (the condition scoped
    ``nvlink-domain``): the domain judge does not count a degraded condition by its scope."""
    t0 = datetime(2026, 11, 26, 12, 0)
    old = Condition(
        reason="UnknownOperationalEvent",
        code="goe-gpu-nvlink-0x0002",
        severity="degraded",
        action="RESET_GPU",
        since=t0,
        scope="nvlink-domain",
    )
    settings = DomainSettings()
    nodes = [NodeFabric(f"tray{i}", DOMAIN, *fabric_fault([old], [], settings, t0)) for i in (0, 1)]
    (verdict,) = judge_domains(nodes, set(), settings)
    assert not verdict.incident


def mig_xid_line(xid: int, gi: int) -> XidObservation:
    """The kernel's MIG Xid line, through the kernel-log parser."""
    parsed = parse_line(
        f"NVRM: Xid (PCI:0000:1b:00 GPU-I:{gi:02d}): {xid}, pid=7194, name=python3, "
        "Uncontained: FBHUB. RST: Yes, D-RST: No"
    )
    assert parsed is not None and parsed.gpu_instance == gi
    pci = PciAddress.parse(parsed.pci_bus_id)
    return XidObservation(
        source="kmsg",
        xid=parsed.xid,
        at=datetime(2026, 11, 26, 12, 0),
        pci=pci,
        message=parsed.message,
        gpu_instance=parsed.gpu_instance,
    )


@pytest.mark.parametrize("order", ["event-first", "line-first"])
@pytest.mark.parametrize("raw", [1, 2])
def test_a_raw_instance_scope_never_confines_a_reset_gpu_fault(order: str, raw: int) -> None:
    """Xid 95 (RESET_GPU) on a MIG GPU: the kernel line names GPU instance 5, the operational
    event carries raw scope 1 or 2 (MIG GPU / compute instance by the subscription enum's
    numbering; the event's own enum is not published). Before: the condition said
    ``gpu-instance`` and only MIG-5-0 got a device taint while the GPU reset destroyed MIG-6-0
    too. Now: GPU-wide."""
    w = World()
    line = mig_xid_line(95, 5)
    event = OperationalEventObservation(
        source="nvml",
        at=w.clock.now(),
        uuid=U0,
        module="GPU-RAS",
        code=0x0030,
        category=0x0002,
        severity=FATAL,
        scope=raw,
        attributes=PRIMARY,
        legacy_xid=95,
        group_cursor=0x1234,
    )
    for obs in (event, line) if order == "event-first" else (line, event):
        w.engine.observe(obs)
        w.clock.advance(0.5)
    c = conditions(w)["xid-95"]
    # the instance comes with the line; a line that follows the event is its duplicate
    assert c.gpu_instance == (5 if order == "line-first" else None)
    assert (c.action, c.scope) == ("RESET_GPU", None)
    assert "unconfirmed" in c.message
    gpu = GpuHealth(0, U0, "unhealthy", (c,), MIGS)
    assert instance_devices(gpu.conditions, MIGS) == ()  # the whole GPU
    assert device_verdict(gpu).instances == ()
    assert scoped_action("reboot", c.scope or "") == "reboot"  # not bounded to a GPU reset
