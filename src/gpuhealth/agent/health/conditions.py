"""Health conditions: the protocol ``Condition`` of a verdict, their order, the GPU's info.

A verdict's code, reason, severity and action come from the rules table
(:mod:`gpuhealth.agent.health.rules`) or the XID catalog. Codes are label values (taint values
on the controller side): ``xid-79``, ``ecc-dbe``, ``gpu-lost`` ... Reasons are CamelCase.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from gpuhealth.agent.health.rules import Verdict
from gpuhealth.agent.health.xid_catalog import XidVerdict
from gpuhealth.agent.observations import GpuIdentity, MigDevice, XidObservation
from gpuhealth.protocol import Condition, GpuInfo, MigDeviceInfo, severity
from gpuhealth.protocol.v1 import MAX_MIG_DEVICES


def condition_sort_key(c: Condition) -> tuple[int, float, str]:
    """Worst first; among equals the oldest (the first fault seen is the root cause: XID 79
    comes before the GPU-lost it leads to), so a later condition never changes the primary."""
    since = c.since.timestamp() if c.since is not None else float("inf")
    return (-severity(c.severity), since, c.code)


def xid_detail(obs: XidObservation) -> str:
    """An XID condition's message: the driver's text, the process it names, the MIG instance."""
    detail = obs.message.strip()
    if obs.pid is not None:
        detail = f"{detail} (pid {obs.pid}{', ' + obs.process_name if obs.process_name else ''})"
    if obs.gpu_instance is not None:
        ci = "" if obs.compute_instance is None else f", compute instance {obs.compute_instance}"
        detail = f"{detail} (MIG GPU instance {obs.gpu_instance}{ci})"
    return detail.strip()


def build_condition(
    verdict: Verdict, message: str, at: datetime, *, xid: int | None = None
) -> Condition:
    """The condition of a non-XID verdict (:data:`~gpuhealth.agent.health.rules.VERDICTS`)."""
    return Condition(
        reason=verdict.reason,
        code=verdict.code,
        severity=verdict.severity,
        action=verdict.action,
        message=message[:1024],
        xid=xid,
        since=at,
    )


def xid_message(name: str, detail: str) -> str:
    """The catalog name, plus the driver's text when it says more than the name does."""
    d = detail.strip()
    if not d:
        return name
    if d.lower().startswith(name.rstrip(".").lower()):
        return d
    return f"{name}: {d}"


def xid_condition(
    v: XidVerdict,
    message: str,
    at: datetime,
    *,
    gpu_instance: int | None = None,
    compute_instance: int | None = None,
) -> Condition:
    return Condition(
        reason=v.reason,
        code=v.code[:63],
        severity=v.severity,
        action=v.action,
        message=message[:1024],
        xid=v.xid,
        since=at,
        gpu_instance=gpu_instance,
        compute_instance=compute_instance,
    )


def gpu_info(g: GpuIdentity, mig: Sequence[MigDevice] = ()) -> GpuInfo:
    return GpuInfo(
        index=min(max(g.index, 0), 1023),
        uuid=g.uuid or "unknown",
        pci_bus_id=g.pci_bus_id[:128],
        model=g.model[:128],
        serial=None if g.serial is None else g.serial[:128],
        memory_total_bytes=g.memory_total_bytes,
        mig_enabled=g.mig_enabled or bool(mig),
        mig_devices=[
            MigDeviceInfo(
                uuid=m.uuid[:253],
                gpu_instance_id=m.gpu_instance_id,
                compute_instance_id=m.compute_instance_id,
            )
            for m in mig[:MAX_MIG_DEVICES]
        ],
    )
