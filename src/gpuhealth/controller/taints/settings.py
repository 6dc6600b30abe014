"""Settings of the taint controller: the policy, the reconciler and DRA device taints (the
``policy:``, ``reconciler:`` and ``dra:`` sections)."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from gpuhealth.common.config import (
    PositiveInt,
    PositiveSeconds,
    SettingError,
    Settings,
)

CordonMode = Literal["never", "quarantine", "hard-taint"]


class PolicySettings(Settings, frozen=True, kw_only=True):
    unhealthy_policy: Literal["any", "min-healthy"] = "any"
    """``any``: one unhealthy GPU taints the node NoSchedule. ``min-healthy``: only fewer than
    ``min_healthy_gpus`` healthy GPUs does; a node with some broken GPUs but enough healthy
    ones gets the degraded (PreferNoSchedule) taint instead."""
    min_healthy_gpus: PositiveInt = 1
    """Used with ``unhealthy_policy: min-healthy``."""
    degraded_taint: bool = True
    """Taint degraded nodes ``<prefix>/degraded=<code>:PreferNoSchedule``."""
    noexecute_codes: tuple[str, ...] = ()
    """Condition codes (``xid-79``, ``gpu-lost`` ...) that also get a NoExecute taint; empty =
    never evict (the default)."""
    taint_on_agent_silent: bool = False
    """Taint ``<prefix>/unhealthy=agent-silent:NoSchedule`` when a node's agent stops reporting.
    Off by default: a silent agent says nothing about the GPUs."""
    taint_on_agent_missing: bool = False
    """Taint ``<prefix>/unhealthy=agent-missing:NoSchedule`` on a GPU node no agent has
    reported for (``incidents.unwatched.grace_s``). Off by default: reported only."""
    cordon: CordonMode = "never"
    """Also cordon (``spec.unschedulable``) a node gpuhealth keeps work off, for tools and
    dashboards that read cordons: ``quarantine`` while it carries the remediation loop's
    quarantine taint, ``hard-taint`` while it carries any NoSchedule/NoExecute taint of ours,
    ``never``. Only a cordon gpuhealth set is lifted (``<prefix>/guards`` records it); a cordon
    follows a taint the circuit breaker allowed. Mind GKE Autopilot: it repairs a node cordoned
    longer than about 10 minutes."""
    disruption_guard: bool = True
    """While a remediation episode holds a node (quarantined through returned, and escalated),
    set ``karpenter.sh/do-not-disrupt`` and
    ``cluster-autoscaler.kubernetes.io/scale-down-disabled`` on it, so that consolidation or
    scale-down does not take it away mid-repair or before its RMA; lifted when the episode
    lets go (only what gpuhealth set, ``<prefix>/guards``). Not set on a node a managed
    repairer owns (``remediation.managed_repair``)."""


class ReconcilerSettings(Settings, frozen=True, kw_only=True):
    workers: Annotated[int, Meta(ge=1, le=1024)] = 32
    """Nodes written concurrently (taints + labels + annotations, one request per node)."""
    status_workers: Annotated[int, Meta(ge=1, le=1024)] = 8
    """Concurrent writers of the GPUHealthy condition (nodes/status), a lower-priority queue."""
    conflict_retries: Annotated[int, Meta(ge=0, le=100)] = 5
    """Immediate re-reads and re-writes on 409 Conflict before requeueing with backoff."""
    backoff_base_s: PositiveSeconds = 0.05
    """First requeue delay after an error; doubles per consecutive failure of that node."""
    backoff_max_s: PositiveSeconds = 30.0
    """Longest requeue delay after repeated errors."""
    resync_interval_s: PositiveSeconds = 300.0
    """Every node is re-checked this often even without a change (level-triggered safety net)."""
    request_timeout_s: PositiveSeconds = 10.0
    """Deadline of one API request."""
    event_queue_size: PositiveInt = 2000
    """Events waiting to be written; beyond this they are dropped (and counted), never block."""
    event_workers: Annotated[int, Meta(ge=1, le=256)] = 4
    """Concurrent writers of Events."""

    def check(self) -> None:
        if self.backoff_base_s > self.backoff_max_s:
            raise SettingError("backoff_base_s", "must not be above backoff_max_s")


class DraSettings(Settings, frozen=True, kw_only=True):
    enabled: bool = True
    """Keep DeviceTaintRules when the API server serves them (discovered at start)."""
    uuid_attribute: str = "uuid"
    """ResourceSlice device attribute holding the device's own UUID (the NVIDIA DRA driver's
    ``uuid``: a GPU's ``GPU-…``, a MIG device's ``MIG-…``)."""
    parent_attribute: str = "parentUUID"
    """ResourceSlice device attribute naming the GPU a MIG device is carved from (the NVIDIA
    DRA driver's ``parentUUID``): a GPU-wide verdict taints those devices too."""
    rediscover_interval_s: PositiveSeconds = 300.0
    """How often the controller checks again whether the API server serves DeviceTaintRules."""
