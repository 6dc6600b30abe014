"""Settings of the controller's parts, each a section of ``ControllerConfig``.

Kept apart from ``config`` so that the parts can import their settings without importing
every other part (``config`` also pulls in the stream and placement settings).
"""

from __future__ import annotations

from typing import Literal

import msgspec


class PolicySettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    unhealthy_policy: Literal["any", "min-healthy"] = "any"
    """``any``: one unhealthy GPU taints the node NoSchedule. ``min-healthy``: only fewer than
    ``min_healthy_gpus`` healthy GPUs does; a node with some broken GPUs but enough healthy
    ones gets the degraded (PreferNoSchedule) taint instead."""
    min_healthy_gpus: int = 1
    """Used with ``unhealthy_policy: min-healthy``."""
    degraded_taint: bool = True
    """Taint degraded nodes ``<prefix>/degraded=<code>:PreferNoSchedule``."""
    noexecute_codes: tuple[str, ...] = ()
    """Condition codes (``xid-79``, ``gpu-lost`` ...) that also get a NoExecute taint; empty =
    never evict (the default)."""
    taint_on_agent_silent: bool = False
    """Taint ``<prefix>/unhealthy=agent-silent:NoSchedule`` when a node's agent stops reporting.
    Off by default: a silent agent says nothing about the GPUs."""


class FleetSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    agent_timeout_s: float = 60.0
    """An agent silent for longer than this makes its node Unknown (heartbeats come every few s)."""
    stale_check_interval_s: float = 5.0
    """How often the fleet looks for agents that went silent."""


class BreakerSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    enabled: bool = True
    max_fraction: float = 0.10
    """Most GPU nodes that may be newly tainted (NoSchedule/NoExecute) within ``window_s``."""
    window_s: float = 600.0
    min_nodes: int = 1
    """New taints always allowed in a window, whatever the fleet size (a 5-node fleet can
    still taint one node)."""
    configmap: str = "gpuhealth-breaker"
    """ConfigMap (in the leader's namespace) that keeps the open/closed state across leader
    changes; an operator may close the breaker by setting ``data.state: closed`` there."""
    sync_interval_s: float = 1.0
    """How soon a trip or a reset is written to the ConfigMap."""
    poll_interval_s: float = 10.0
    """While open, how often the ConfigMap is read for an operator's reset."""


class ReconcilerSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    workers: int = 32
    """Nodes written concurrently (taints + labels + annotations, one request per node)."""
    status_workers: int = 8
    """Concurrent writers of the GPUHealthy condition (nodes/status), a lower-priority queue."""
    conflict_retries: int = 5
    """Immediate re-reads and re-writes on 409 Conflict before requeueing with backoff."""
    backoff_base_s: float = 0.05
    """First requeue delay after an error; doubles per consecutive failure of that node."""
    backoff_max_s: float = 30.0
    resync_interval_s: float = 300.0
    """Every node is re-checked this often even without a change (level-triggered safety net)."""
    request_timeout_s: float = 10.0
    """Deadline of one API request."""
    event_queue_size: int = 2000
    """Events waiting to be written; beyond this they are dropped (and counted), never block."""
    event_workers: int = 4


class WatchSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    timeout_s: int = 300
    """Server-side watch timeout; the watch is resumed from the last resourceVersion."""
    relist_backoff_s: float = 1.0
    """Pause before a relist after a watch error (410 Gone relists at once)."""


class LeaderSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    enabled: bool = True
    namespace: str = "gpuhealth"
    lease_name: str = "gpuhealth-controller"
    identity: str = ""
    """Empty = ``$POD_NAME`` or ``hostname-pid``."""
    lease_duration_s: int = 15
    """Whole seconds (the Lease stores an integer): how long a dead leader blocks takeover."""
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0


class DraSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    enabled: bool = True
    """Keep DeviceTaintRules when the API server serves them (discovered at start)."""
    uuid_attribute: str = "uuid"
    """ResourceSlice device attribute holding the GPU UUID (the NVIDIA DRA driver's ``uuid``)."""
    rediscover_interval_s: float = 300.0
