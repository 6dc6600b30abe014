"""The controller's configuration: a YAML file (``--config``) with command-line flags on top.

Every timeout, interval and threshold is a named field below with its production default.
An unknown key or a value of the wrong type is a :class:`ConfigError` naming the file and field.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import msgspec
import yaml

from common.errors import ConfigError


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
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0


class DraSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    enabled: bool = True
    """Keep DeviceTaintRules when the API server serves them (discovered at start)."""
    uuid_attribute: str = "uuid"
    """ResourceSlice device attribute holding the GPU UUID (the NVIDIA DRA driver's ``uuid``)."""
    rediscover_interval_s: float = 300.0


class ControllerConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    prefix: str = "gpuhealth.io"
    """Prefix of every taint key, label, annotation the controller owns."""
    listen: str = "0.0.0.0:8080"
    kubeconfig: str | None = None
    """None = in-cluster ServiceAccount."""
    dry_run: bool = False
    """Decide and log, write nothing to the API server."""
    events_namespace: str = "default"
    """Namespace of Events about Nodes: ``default`` (the API server accepts Events about
    cluster-scoped objects only there; the kubelet uses it too)."""
    gpu_resource: str = "nvidia.com/gpu"
    """A Node with this in status.capacity counts as a GPU node (the breaker's denominator)."""
    log_level: str = "info"
    log_format: Literal["auto", "json", "console"] = "auto"
    shutdown_timeout_s: float = 10.0
    policy: PolicySettings = msgspec.field(default_factory=PolicySettings)
    fleet: FleetSettings = msgspec.field(default_factory=FleetSettings)
    breaker: BreakerSettings = msgspec.field(default_factory=BreakerSettings)
    reconciler: ReconcilerSettings = msgspec.field(default_factory=ReconcilerSettings)
    watch: WatchSettings = msgspec.field(default_factory=WatchSettings)
    leader: LeaderSettings = msgspec.field(default_factory=LeaderSettings)
    dra: DraSettings = msgspec.field(default_factory=DraSettings)

    def leader_identity(self) -> str:
        if self.leader.identity:
            return self.leader.identity
        return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        elif value is not None:
            out[key] = value
    return out


def load_config(path: str | None, overrides: Mapping[str, Any] | None = None) -> ControllerConfig:
    """The file's settings with ``overrides`` (flags that were given, None = not given) on top."""
    data: dict[str, Any] = {}
    where = path or "flags"
    if path:
        try:
            loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"config file {path}: {exc.strerror or exc}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path}: not valid YAML: {exc}") from exc
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {path}: the top level must be a mapping")
        data = loaded or {}
    data = _merge(data, overrides or {})
    try:
        cfg = msgspec.convert(data, ControllerConfig, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    _validate(cfg, where)
    return cfg


def _validate(cfg: ControllerConfig, where: str) -> None:
    if not 0.0 <= cfg.breaker.max_fraction <= 1.0:
        raise ConfigError(f"{where}: breaker.max_fraction must be within 0..1")
    if cfg.reconciler.workers < 1 or cfg.reconciler.status_workers < 1:
        raise ConfigError(f"{where}: reconciler workers must be >= 1")
    lead = cfg.leader
    if not lead.lease_duration_s > lead.renew_deadline_s > 1.2 * lead.retry_period_s >= 1.2:
        raise ConfigError(
            f"{where}: leader needs lease_duration_s > renew_deadline_s > 1.2 x retry_period_s"
            " and retry_period_s >= 1"
        )
    if not cfg.prefix or "/" in cfg.prefix:
        raise ConfigError(f"{where}: prefix must be a DNS subdomain such as gpuhealth.io")
