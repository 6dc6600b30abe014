"""The controller's configuration: a YAML file (``--config``) with command-line flags on top.

Every timeout, interval and threshold is a named field below with its production default.
An unknown key or a value of the wrong type is a :class:`ConfigError` naming the file and field.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Any, Literal

import msgspec

from gpuhealth.common.config import load_settings
from gpuhealth.common.errors import ConfigError
from gpuhealth.controller.idle import IdleConfig
from gpuhealth.controller.placement.settings import ExtenderSettings
from gpuhealth.controller.settings import (
    BreakerSettings,
    DraSettings,
    FleetSettings,
    LeaderSettings,
    PolicySettings,
    ReconcilerSettings,
    WatchSettings,
)
from gpuhealth.controller.stream.settings import StreamServerSettings


class ControllerConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    prefix: str = "gpuhealth.io"
    """Prefix of every taint key, label, annotation the controller owns."""
    listen: str = "0.0.0.0:8080"
    kubeconfig: str | None = None
    """None = in-cluster ServiceAccount."""
    dry_run: bool = False
    """Decide and log, write nothing to the API server."""
    tls_cert_file: str | None = None
    """PEM certificate chain for the HTTP server (agents' stream, extender, API); with
    ``tls_key_file``. None = plain HTTP (terminate TLS elsewhere, or trusted network only)."""
    tls_key_file: str | None = None
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
    stream: StreamServerSettings = msgspec.field(default_factory=StreamServerSettings)
    """The agents' WebSocket (controller/stream/settings.py)."""
    extender: ExtenderSettings = msgspec.field(default_factory=ExtenderSettings)
    """The scheduler extender (controller/placement/settings.py)."""
    idle: IdleConfig = msgspec.field(default_factory=IdleConfig)
    """Idle-allocation detection (controller/idle.py)."""

    def leader_identity(self) -> str:
        if self.leader.identity:
            return self.leader.identity
        return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def load_config(path: str | None, overrides: Mapping[str, Any] | None = None) -> ControllerConfig:
    """The file's settings with ``overrides`` (flags that were given, None = not given) on top."""
    cfg = load_settings(ControllerConfig, path, overrides)
    _validate(cfg, path or "flags")
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


__all__ = [
    "BreakerSettings",
    "ControllerConfig",
    "DraSettings",
    "FleetSettings",
    "LeaderSettings",
    "PolicySettings",
    "ReconcilerSettings",
    "WatchSettings",
    "load_config",
]
