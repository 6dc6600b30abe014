"""The controller's settings: a YAML file (``--config``) with command-line flags on top.

:class:`ControllerSettings` holds one section per part; each package keeps its own section in
its ``settings`` module (``breaker/``, ``fleet/``, ``http/``, ``leadership/``, ``taints/``,
``cleanup/``, ``stream/``, ``placement/``, ``idle/``, ``remediation/``, ``incidents/``, and
the LIST+WATCH's in ``kube/``), so a part imports its settings without importing every other
part. Only the composition (``compose``, ``app``, the commands) imports this module.

Every timeout, interval and threshold is a named field below or in a section, with its
production default and its bounds. An unknown key, a value of the wrong type or out of bounds,
or a broken rule between fields is a :class:`ConfigError` naming the file, line and field (the
convention: :mod:`gpuhealth.common.config`, docs/architecture.md "Settings").
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from gpuhealth.common.config import (
    PositiveSeconds,
    SettingError,
    Settings,
    load_settings,
    parse_listen,
)
from gpuhealth.common.errors import ConfigError
from gpuhealth.controller.breaker.settings import BreakerSettings
from gpuhealth.controller.cleanup.settings import CleanupSettings
from gpuhealth.controller.fleet.settings import FleetSettings
from gpuhealth.controller.http.settings import HttpSettings, TlsSettings
from gpuhealth.controller.idle.settings import IdleSettings
from gpuhealth.controller.incidents.domain_settings import DomainSettings
from gpuhealth.controller.incidents.settings import IncidentSettings
from gpuhealth.controller.kube.settings import WatchSettings
from gpuhealth.controller.leadership.settings import LeaderSettings
from gpuhealth.controller.names import DEFAULT_PREFIX, LABEL_NAME_MAX, NODE_RESTRICTION_PREFIX, Keys
from gpuhealth.controller.placement.settings import ExtenderSettings
from gpuhealth.controller.remediation.settings import RemediationSettings
from gpuhealth.controller.shards.settings import ShardSettings
from gpuhealth.controller.stream.settings import StreamServerSettings
from gpuhealth.controller.taints.settings import DraSettings, PolicySettings, ReconcilerSettings

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
RESERVED_PREFIXES = ("kubernetes.io", "k8s.io")
"""Kubernetes' own key prefixes (and their subdomains): never ours to own."""


def check_prefix(prefix: str) -> None:
    """The controller removes every taint, label and annotation under its prefix that it does
    not want (reconciler, uninstall cleanup): the prefix must be a DNS subdomain (the only
    form a key prefix can take) and not Kubernetes' own (``kubernetes.io/hostname``,
    ``node.kubernetes.io/unschedulable`` ...). The operator's override labels
    (``node-restriction.kubernetes.io/<prefix>-exclude``, ``...-remediation``) carry it in
    their name part, which Kubernetes limits to 63 characters: a longer prefix could not
    form them."""
    if len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix):
        raise SettingError("prefix", f"must be a DNS subdomain such as {DEFAULT_PREFIX}")
    for reserved in RESERVED_PREFIXES:
        if prefix == reserved or prefix.endswith("." + reserved):
            raise SettingError(
                "prefix", f"{reserved} and its subdomains are reserved for Kubernetes' own keys"
            )
    keys = Keys(prefix)
    longest = max((keys.exclude_label, keys.opt_out_label), key=len)
    name = longest.partition("/")[2]
    if len(name) > LABEL_NAME_MAX:
        room = LABEL_NAME_MAX - (len(name) - len(prefix))
        raise SettingError(
            "prefix",
            f"at most {room} characters (got {len(prefix)}): the operator's override label "
            f"{longest} must have a name part after {NODE_RESTRICTION_PREFIX}/ of at most "
            f"{LABEL_NAME_MAX} characters",
        )


class ControllerSettings(Settings, frozen=True, kw_only=True):
    prefix: str = DEFAULT_PREFIX
    """Prefix of every taint key, label, annotation the controller owns."""
    listen: str = "0.0.0.0:8080"
    """``HOST:PORT`` of the one HTTP server: the agents' stream, API, status page, scheduler
    extender, probes and metrics."""
    kubeconfig: str | None = None
    """None = in-cluster ServiceAccount."""
    dry_run: bool = False
    """Decide and log, write nothing to the API server."""
    tls_cert_file: str | None = None
    """PEM certificate chain for the HTTP server (agents' stream, extender, API); with
    ``tls_key_file``. None = plain HTTP (terminate TLS elsewhere, or trusted network only)."""
    tls_key_file: str | None = None
    """PEM private key of ``tls_cert_file``."""
    tls_reload_interval_s: PositiveSeconds = 60.0
    """How often the controller checks ``tls_cert_file``/``tls_key_file`` for a renewed pair
    (cert-manager, a rotated Secret) and serves it to new connections, without a restart."""
    allow_plaintext_orders: bool = False
    """Let the remediation loop (``remediation.enabled``) run without TLS, so that its GPU
    reset and reboot orders and the agents' tokens travel in plaintext. Off: such a
    controller refuses to serve (``gpuhealth-controller cleanup`` reads the same file and
    does not mind). For tests and demos on one machine, or where TLS is
    terminated in front of the controller on the same host (a mesh sidecar); the chart
    never sets it."""
    events_namespace: str = "default"
    """Namespace of Events about Nodes: ``default`` (the API server accepts Events about
    cluster-scoped objects only there; the kubelet uses it too)."""
    gpu_resource: str = "nvidia.com/gpu"
    """A Node with this in status.capacity counts as a GPU node (the breaker's denominator)."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Least severe log level written."""
    log_format: Literal["auto", "json", "console"] = "auto"
    """``json`` (production), ``console`` (readable on a terminal), or ``auto``: console when
    stderr is a terminal, else JSON."""
    shutdown_timeout_s: PositiveSeconds = 10.0
    """How long SIGTERM waits for the parts to stop (the leader gives up its Lease), and
    then at most as long for the HTTP listener's open connections. The agents' streams are
    drained first (``stream.close_timeout_s``, twice at most), so a stop takes well under the
    Pod's grace period (30 s) even in a reconnect storm."""
    event_loop: Literal["uvloop", "asyncio"] = "uvloop"
    """The event loop: ``uvloop`` (libuv, its sockets and transports in C: a fifth less CPU per
    agent Heartbeat than asyncio's own, bench ``stream_cpu_per_heartbeat`` 151 -> 124 us) or
    ``asyncio`` (the standard library's, should uvloop misbehave). Either way the controller
    paces its own accepts (``http.accept_batch``, ``http.max_unready``)."""
    gc_young_threshold: Annotated[int, Meta(ge=700, le=1_000_000)] = 10_000
    """Allocations between two collections of CPython's young generation (CPython: 700). A
    request's objects then die before they are collected instead of reaching the old
    generation, whose full collections walk the whole fleet and hold the event loop
    (``controller/heap.py``)."""
    loop_lag_interval_s: Annotated[float, Meta(gt=0.0, le=60.0)] = 0.5
    """How often the event loop's lag is measured (``gpuhealth_controller_event_loop_lag_seconds``:
    how much later than due a sleeping task woke)."""
    gc_freeze_at_start: bool = True
    """Once the first LIST of Nodes and agent pods is in, freeze every object then alive
    (``gc.freeze``): full collections no longer walk the caches (``controller/heap.py``)."""
    gc_full_wait_max_s: Annotated[float, Meta(ge=0.0, le=3600.0)] = 120.0
    """During an admission storm (agents waiting for a turn or told to come back) CPython's
    full collections wait, at most this long in a row (``controller/heap.py``): a full
    collection at 19,000 agents holds the event loop 1-1.7 s, and during a storm the Lease
    renewal already waits on a busy API server. 0: they never wait."""
    shutdown_deadline_s: PositiveSeconds = 25.0
    """The whole stop on SIGTERM (streams drained, parts stopped, Lease given up, listener
    closed) ends within this; past it the step running is cancelled and the rest skipped
    (``shutdown_deadline_passed`` is logged). Keep it below the Pod's
    ``terminationGracePeriodSeconds`` (the chart sets it 5 s below), or the kubelet kills
    the controller mid-step."""
    startup_timeout_s: PositiveSeconds = 30.0
    """At start, how long the controller waits for the API server to answer (``GET /version``,
    retried) before it exits with an error; a wrong address or credentials fail at once."""
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
    idle: IdleSettings = msgspec.field(default_factory=IdleSettings)
    """Idle-allocation detection (controller/idle/settings.py)."""
    remediation: RemediationSettings = msgspec.field(default_factory=RemediationSettings)
    """The remediation loop (controller/remediation/settings.py, docs/remediation.md): off by
    default, each action turned on by itself."""
    cleanup: CleanupSettings = msgspec.field(default_factory=CleanupSettings)
    """``gpuhealth-controller cleanup`` (controller/cleanup/steps.py)."""
    http: HttpSettings = msgspec.field(default_factory=HttpSettings)
    """The HTTP server: slow-client bounds and who must authenticate
    (controller/http/settings.py)."""
    tls: TlsSettings = msgspec.field(default_factory=TlsSettings)
    """A certificate the controller keeps itself, and the CA it publishes for agents
    (controller/http/certificates.py)."""
    incidents: IncidentSettings = msgspec.field(default_factory=IncidentSettings)
    """Fleet-level incidents: job or GPU for application-class XIDs, GPU nodes nobody watches
    (controller/incidents/settings.py, docs/operations.md "Incidents")."""
    domains: DomainSettings = msgspec.field(default_factory=DomainSettings)
    """NVLink domain incidents: one incident, one taint, one breaker decision for a shared
    fabric (controller/incidents/domain_settings.py, docs/operations.md "NVLink domains")."""
    shards: ShardSettings = msgspec.field(default_factory=ShardSettings)
    """Past one process: the fleet cut into shards, each owned through its own Lease
    (docs/architecture.md, "Past one process"); ``count: 1`` (the default) is one process
    for the fleet."""

    def check(self) -> None:
        check_prefix(self.prefix)
        try:
            parse_listen(self.listen)
        except ConfigError as exc:
            raise SettingError("listen", str(exc)) from exc
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise SettingError(
                "tls_key_file" if self.tls_cert_file else "tls_cert_file",
                "--tls-cert-file and --tls-key-file must be given together "
                "(tls_cert_file, tls_key_file)",
            )
        if self.tls.secret and not self.tls_cert_file:
            raise SettingError(
                "tls.secret", "needs tls_cert_file and tls_key_file: where the pair is written"
            )
        if self.shards.count > 1 and not self.leader.enabled:
            raise SettingError(
                "shards.count",
                "above 1 needs leader.enabled: each shard is owned through its own Lease",
            )

    def leader_identity(self) -> str:
        if self.leader.identity:
            return self.leader.identity
        return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def load_config(path: str | None, overrides: Mapping[str, Any] | None = None) -> ControllerSettings:
    """The file's settings with ``overrides`` (flags that were given, None = not given) on top."""
    return load_settings(ControllerSettings, path, overrides)


__all__ = [
    "BreakerSettings",
    "CleanupSettings",
    "ControllerSettings",
    "DraSettings",
    "FleetSettings",
    "LeaderSettings",
    "PolicySettings",
    "ReconcilerSettings",
    "WatchSettings",
    "load_config",
]
