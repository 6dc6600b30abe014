"""Settings of the controller's parts, each a section of ``ControllerConfig``.

Kept apart from ``config`` so that the parts can import their settings without importing
every other part (``config`` also pulls in the stream and placement settings).
"""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from gpuhealth.common.config import (
    Count,
    PositiveInt,
    PositiveSeconds,
    Ratio,
    Seconds,
    SettingError,
    Settings,
)


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


class FleetSettings(Settings, frozen=True, kw_only=True):
    agent_timeout_s: PositiveSeconds = 60.0
    """An agent silent for longer than this makes its node Unknown (heartbeats come every few s)."""
    stale_check_interval_s: PositiveSeconds = 5.0
    """How often the fleet looks for agents that went silent."""
    waiting_grace_s: PositiveSeconds = 180.0
    """An agent that is waiting for its turn to be admitted (queued, or told to come back
    after a restart or failover) is quiet because of the controller, not because it is gone:
    its node is not called silent for up to this much longer than ``agent_timeout_s``. Bounded
    because a waiting Hello is not yet authenticated."""


class BreakerSettings(Settings, frozen=True, kw_only=True):
    enabled: bool = True
    """Off: every new hard taint is allowed (no storm protection)."""
    max_fraction: Ratio = 0.10
    """Most GPU nodes that may be newly tainted (NoSchedule/NoExecute) within ``window_s``."""
    window_s: PositiveSeconds = 600.0
    """The sliding window ``max_fraction`` counts new taints in."""
    min_nodes: Count = 1
    """New taints always allowed in a window, whatever the fleet size (a 5-node fleet can
    still taint one node)."""
    configmap: str = "gpuhealth-breaker"
    """ConfigMap (in the leader's namespace) that keeps the open/closed state and the window
    of recently disrupted nodes across restarts and leader changes; an operator may close the
    breaker by setting ``data.state: closed`` there."""
    sync_interval_s: PositiveSeconds = 1.0
    """How soon a trip, a reset or a newly counted node is written to the ConfigMap."""
    poll_interval_s: PositiveSeconds = 10.0
    """While open, how often the ConfigMap is read for an operator's reset."""


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


class WatchSettings(Settings, frozen=True, kw_only=True):
    timeout_s: Annotated[int, Meta(ge=1, le=3600)] = 300
    """Server-side watch timeout; the watch is resumed from the last resourceVersion."""
    relist_backoff_s: Seconds = 1.0
    """First pause after a watch error before the watch resumes or relists (410 Gone relists
    at once)."""
    relist_backoff_max_s: Seconds = 30.0
    """Longest pause after consecutive watch errors: the pause doubles per failure from
    ``relist_backoff_s`` up to this; a successful list or watch event starts again."""


class LeaderSettings(Settings, frozen=True, kw_only=True):
    enabled: bool = True
    """Off: no Lease; this replica always acts as the leader (a single replica only)."""
    namespace: str = "gpuhealth"
    """Namespace of the Lease, the breaker ConfigMap and the operators' access checks (the
    release namespace)."""
    lease_name: str = "gpuhealth-controller"
    """Name of the coordination.k8s.io Lease the replicas compete for."""
    identity: str = ""
    """Empty = ``$POD_NAME`` or ``hostname-pid``."""
    lease_duration_s: Annotated[int, Meta(ge=2, le=3600)] = 15
    """Whole seconds (the Lease stores an integer): how long a dead leader blocks takeover."""
    renew_deadline_s: PositiveSeconds = 10.0
    """How long the leader keeps retrying a failed renewal before it stops acting."""
    retry_period_s: Annotated[float, Meta(ge=1.0, le=3600.0)] = 2.0
    """Time between attempts to acquire or renew the Lease."""
    request_timeout_s: PositiveSeconds = 5.0
    """Deadline of one Lease read or write (a renewal also stops at ``renew_deadline_s``)."""
    service: str = ""
    """The controller's Service (without a selector) whose endpoint the leader publishes: an
    EndpointSlice ``<service>-leader`` pointing at this pod's ``$POD_IP``, so agents and
    kube-scheduler reach the leader (controller/kube/leader_endpoint.py). Empty: none."""
    endpoint_interval_s: PositiveSeconds = 10.0
    """How often the leader re-asserts that endpoint (repairs an edit or a lost write)."""

    def check(self) -> None:
        if not self.lease_duration_s > self.renew_deadline_s:
            raise SettingError("renew_deadline_s", "must be shorter than lease_duration_s")
        if not self.renew_deadline_s > 1.2 * self.retry_period_s:
            raise SettingError("retry_period_s", "must be under renew_deadline_s / 1.2")


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


class CleanupSettings(Settings, frozen=True, kw_only=True):
    """``gpuhealth-controller cleanup`` (the chart's pre-delete hook): removing what the
    controller wrote before it is uninstalled (controller/kube/cleanup.py)."""

    stop_timeout_s: PositiveSeconds = 120.0
    """How long cleanup waits for the controller to stop (its pods gone, its Lease given up
    or expired) before it fails without touching anything."""
    poll_interval_s: PositiveSeconds = 1.0
    """How often cleanup looks again while it waits for the controller to stop."""
    request_timeout_s: PositiveSeconds = 10.0
    """Deadline of one API request."""
    conflict_retries: Annotated[int, Meta(ge=1, le=100)] = 5
    """A Node that changed under a write (409) is read and planned again this many times."""
    page_size: Annotated[int, Meta(ge=1, le=5000)] = 500
    """Objects per list request (Nodes, Pods)."""
