"""The ``incidents:`` section of the controller configuration: how application-class XIDs are
judged at the fleet level (job or GPU) and when a GPU node nobody watches is reported."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from gpuhealth.common.config import PositiveInt, PositiveSeconds, Seconds, SettingError, Settings

XidCode = Annotated[int, Meta(ge=1, le=1023)]

DEFAULT_XID_CLASSES: dict[str, list[int]] = {"app-fault": [13, 31], "app-abort": [43, 45]}
"""The catalog's application XIDs that may also be the GPU's (13 graphics exception, 31 MMU
fault: NVIDIA's XID 13/31 workflows) and the aborts that follow a crash (43, 45)."""


class JudgeSettings(Settings, frozen=True, kw_only=True):
    """Job or GPU: the fleet-level decision over application-class XIDs."""

    enabled: bool = True
    """Judge application-class XIDs fleet-wide: a job crash is a job incident (nothing tainted),
    a GPU faulting under several jobs is blamed (unhealthy, diagnostic). Off: the agents'
    per-GPU ``xid-repeated`` verdicts act alone, as before."""
    xid_classes: dict[str, list[XidCode]] = msgspec.field(
        default_factory=lambda: {k: list(v) for k, v in DEFAULT_XID_CLASSES.items()}
    )
    """Class name -> XIDs. Only XIDs listed here are judged; reports correlate within a class."""
    gpu_blame_classes: list[str] = msgspec.field(default_factory=lambda: ["app-fault"])
    """Classes whose repeats under different jobs blame the GPU (aborts never do)."""
    job_window_s: PositiveSeconds = 600.0
    """Reports of one job's GPUs within this window are one crash."""
    job_min_nodes: PositiveInt = 2
    """The same XID class on GPUs of at least this many nodes running one job makes a job
    incident (the job's fault: no GPU blamed, nothing tainted)."""
    gpu_window_s: PositiveSeconds = 3600.0
    """The window ``gpu_min_jobs`` counts a GPU's faults in."""
    gpu_min_jobs: PositiveInt = 3
    """A GPU faulting under this many different jobs (a fault with no job on the GPU counts as
    one more each burst) within ``gpu_window_s`` is blamed."""
    burst_s: Seconds = 10.0
    """Reports of one GPU closer together than this are one burst (one crash logs many)."""
    allocation_linger_s: Seconds = 120.0
    """A report is charged to the GPU's last pod for this long after the pod left the GPU
    (the kubelet may forget a crashed pod before its XID arrives)."""
    blame_hold_s: PositiveSeconds = 86400.0
    """A blamed GPU stays blamed this long after its last counted fault (a remediation
    episode resets and validates it with the diagnostic meanwhile, when the loop is on)."""
    incident_close_s: PositiveSeconds = 3600.0
    """A job incident with no new report for this long is closed."""
    judge_agent_escalation: bool = True
    """The agent's own ``xid-repeated`` verdict (repeats of an application XID on one GPU,
    whatever the jobs) is left to this judge: it never degrades or taints a node by itself."""
    pod_lookup_ttl_s: PositiveSeconds = 86400.0
    """How long a pod's job (owner and gang) is remembered (pods are looked up when they
    appear on a GPU, so a crashed pod deleted before its XID arrives is still known)."""
    tick_s: PositiveSeconds = 10.0
    """How often blames and job incidents are looked at again without a new report (expiry)."""
    max_reports: PositiveInt = 100000
    """Reports kept in the windows (oldest dropped first)."""
    events: bool = True
    """A Warning Event on the job's owner and its pods when a job incident opens."""

    def check(self) -> None:
        unknown = [c for c in self.gpu_blame_classes if c not in self.xid_classes]
        if unknown:
            raise SettingError("gpu_blame_classes", f"names unknown classes: {unknown}")
        seen: dict[int, str] = {}
        for name, codes in self.xid_classes.items():
            for code in codes:
                if code in seen:
                    raise SettingError("xid_classes", f"XID {code} is in {seen[code]} and {name}")
                seen[code] = name
        if self.burst_s >= self.job_window_s:
            raise SettingError("burst_s", "must be shorter than job_window_s")

    def class_of(self, xid: int) -> str | None:
        for name, codes in self.xid_classes.items():
            if xid in codes:
                return name
        return None


class UnwatchedSettings(Settings, frozen=True, kw_only=True):
    """GPU nodes whose agent never reported (or stopped and never came back)."""

    enabled: bool = True
    """Report GPU nodes without an agent: condition, metric, incident."""
    grace_s: PositiveSeconds = 600.0
    """A GPU node is unwatched once no agent has reported for it this long (counted from the
    node's creation or this controller's start, whichever is later)."""
    check_interval_s: PositiveSeconds = 30.0
    """How often GPU nodes are compared with the agents that report."""
    gpu_present_label: str = "nvidia.com/gpu.present"
    """GPU feature discovery's label (value ``true``) that marks a GPU node, besides GPU
    capacity."""


class IncidentSettings(Settings, frozen=True, kw_only=True):
    """The ``incidents:`` section."""

    judge: JudgeSettings = msgspec.field(default_factory=JudgeSettings)
    unwatched: UnwatchedSettings = msgspec.field(default_factory=UnwatchedSettings)
    closed_keep: PositiveInt = 200
    """Closed incidents kept for the API and the status page, and GPUIncident objects of
    closed incidents kept in the cluster (the oldest beyond it are deleted)."""
    persist_interval_s: PositiveSeconds = 300.0
    """How often an incident's ``lastSeen`` reaches its GPUIncident object (it moves with
    every report; opening, closing and every change of the decision are written at once)."""
    closed_retention_s: PositiveSeconds = 604800.0
    """A closed incident's GPUIncident object is deleted this long after it closed (7 days)."""
    retry_backoff_s: PositiveSeconds = 1.0
    """First pause after a failed write of a GPUIncident, or a failed LIST when a new leader
    adopts them (doubling per consecutive failure)."""
    retry_backoff_max_s: PositiveSeconds = 30.0
    """Longest such pause; the decision stays in memory and is written once the API server
    takes it (a new leader's reconciler waits for the adoption)."""
    capability_check_s: PositiveSeconds = 30.0
    """How often the remediation episodes are looked at for agents that cannot carry them
    out (``NoExecutor``): one ``capability`` incident names every such node."""

    def check(self) -> None:
        if self.retry_backoff_max_s < self.retry_backoff_s:
            raise SettingError("retry_backoff_max_s", "must not be shorter than retry_backoff_s")
