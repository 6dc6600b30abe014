"""What a GPU's multi-node NVLink fabric info and the node's NVSwitch errors mean (pure).

The judges of the ``fabric-not-ready`` and ``fabric-degraded`` sample rules
(:data:`gpuhealth.agent.health.rules.SAMPLE_RULES`) and their messages. A sample without
fabric info (NOT_SUPPORTED: not a multi-node NVLink system; not read) is not judged.
"""

from __future__ import annotations

from gpuhealth.agent.health.settings import HealthSettings
from gpuhealth.agent.observations import FABRIC_HEALTH_FLAGS, GpuSample, SxidObservation

DEGRADING_FLAGS = frozenset(FABRIC_HEALTH_FLAGS)
"""Health-mask flags that make the fabric degraded (every flag NVML's mask can set TRUE)."""


def not_ready(smp: GpuSample, _: HealthSettings, __: int) -> bool | None:
    """The GPU has a fabric and its registration has not completed, or completed with an
    error status."""
    f = smp.fabric
    if f is None:
        return None
    return f.state != "completed" or f.status != 0


def not_ready_message(smp: GpuSample, s: HealthSettings, _: int) -> str:
    f = smp.fabric
    if f is None:  # pragma: no cover - only described once judged bad
        return "NVLink fabric not ready"
    if f.state == "completed":
        return f"NVLink fabric registration failed (NVML status {f.status})"
    return (
        f"NVLink fabric registration {f.state} for {s.fabric_not_ready_s:.0f} s or more "
        f"(cluster {f.cluster_uuid or 'unknown'}, clique {f.clique_id})"
    )


def degraded(smp: GpuSample, _: HealthSettings, __: int) -> bool | None:
    """The fabric reports itself degraded through its health mask."""
    f = smp.fabric
    if f is None:
        return None
    return bool(f.health & DEGRADING_FLAGS)


def degraded_message(smp: GpuSample, _: HealthSettings, __: int) -> str:
    flags = sorted((smp.fabric.health if smp.fabric else frozenset()) & DEGRADING_FLAGS)
    domain = smp.fabric.domain if smp.fabric else None
    where = f" (domain {domain})" if domain else ""
    return "NVLink fabric reports " + ", ".join(flags) + where


def fabric_gate(smp: GpuSample) -> bool:
    """Only GPUs with a fabric are judged (one call per clean sample elsewhere)."""
    return smp.fabric is not None


def sxid_message(obs: SxidObservation) -> str:
    switch = f"nvswitch{obs.switch}" if obs.switch is not None else "an NVSwitch"
    link = f" link {obs.link}" if obs.link is not None else ""
    text = f": {obs.message}" if obs.message else ""
    return f"fatal SXid {obs.sxid} on {switch}{link}{text}"[:1024]
