"""The agent's configuration: a YAML file (``--config``) with command-line flags on top.

Every interval, timeout and threshold is a named field here or in the nested sections
(health, nvml, kmsg, dcgm, rdma, podresources, stream, remediation), each with its production
default and its bounds. A key that does not exist, a value of the wrong type or out of
bounds, or a broken rule between fields is a :class:`ConfigError` naming the file, line
and field (the convention: :mod:`gpuhealth.common.config`, docs/architecture.md "Settings").
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from gpuhealth.agent.health import HealthSettings
from gpuhealth.agent.podresources.settings import PodResourcesSettings
from gpuhealth.agent.remediation.settings import AgentRemediationSettings
from gpuhealth.agent.sources.dcgm.settings import DcgmSettings
from gpuhealth.agent.sources.kmsg.settings import KmsgSettings
from gpuhealth.agent.sources.nvml.settings import NvmlSettings
from gpuhealth.agent.sources.rdma.settings import RdmaSettings
from gpuhealth.agent.stream.settings import StreamClientSettings
from gpuhealth.common.config import (
    PositiveSeconds,
    SettingError,
    Settings,
    load_settings,
    parse_listen,
)
from gpuhealth.common.errors import ConfigError
from gpuhealth.protocol.shards import MAX_SHARDS, SHARD_PLACEHOLDER

SourceKind = Literal["nvml", "dcgm-exporter", "sim"]
LogFormat = Literal["auto", "json", "console"]
LogLevel = Literal["debug", "info", "warning", "error"]
KMSG_DISABLED = "none"


class AgentSettings(Settings, frozen=True, kw_only=True):
    node_name: str = ""
    """The Kubernetes node this agent speaks for; empty = ``$NODE_NAME``, else the hostname."""
    source: SourceKind = "nvml"
    """Where GPU telemetry comes from: NVML, a node-local dcgm-exporter, or the simulator."""
    sim_scenario: str | None = None
    """Scenario YAML for ``source: sim`` (None: healthy GPUs, no faults)."""
    sim_seed: Annotated[int, Meta(ge=0, le=2**63 - 1)] = 0
    """Seed of the simulator's baseline noise (same seed, same run)."""
    kmsg_path: str = "/dev/kmsg"
    """Kernel log to follow for ``NVRM: Xid`` lines (a file or FIFO in tests); ``none`` disables."""
    listen: str = "0.0.0.0:9455"
    """HOST:PORT of /metrics, /healthz, /readyz and /api/v1/status."""
    controller_url: str | None = None
    """``wss://…/v1/stream`` of the controller; None runs the agent stand-alone. With
    ``controller_shards`` above 1 it holds ``{shard}`` (each shard's Service:
    ``wss://gpuhealth-controller-shard-{shard}.<namespace>.svc:8443/v1/stream``); with one
    shard a ``{shard}`` in it is 0."""
    controller_shards: Annotated[int, Meta(ge=1, le=MAX_SHARDS)] = 1
    """The controller's shard count (the chart's ``shards.count``): the agent dials the shard
    of its node's name first, and the one a replica names when it turns the agent away
    (a node whose NVLink domain belongs to another shard)."""
    controller_ca_file: str | None = None
    """CA bundle that signs the controller's certificate (None: the system CAs)."""
    token_file: str = "/var/run/secrets/gpuhealth/token"
    """Projected ServiceAccount token (audience ``gpuhealth``), re-read when rotated."""
    state_dir: str = "/var/lib/gpuhealth"
    """The stream outbox and the latched verdicts live here (a hostPath survives restarts)."""
    dcgm_exporter_url: str = "http://127.0.0.1:9400/metrics"
    """The node-local dcgm-exporter scraped by ``source: dcgm-exporter``."""
    log_format: LogFormat = "auto"
    """``json`` for production, ``console`` for people; ``auto`` = console on a terminal."""
    log_level: LogLevel = "info"
    """Least severe log level written (debug, info, warning, error)."""
    tick_interval_s: PositiveSeconds = 1.0
    """How often the health engine re-evaluates time-based rules (clean windows, staleness)."""
    shutdown_timeout_s: PositiveSeconds = 5.0
    """How long SIGTERM waits for tasks to stop before giving up on them."""
    state_checkpoint_interval_s: PositiveSeconds = 30.0
    """The agent's state store (``state.db`` in the state dir) copies its write-ahead log into
    the database this often, in a worker thread, never in a commit on the event loop."""
    health: HealthSettings = msgspec.field(default_factory=HealthSettings)
    nvml: NvmlSettings = msgspec.field(default_factory=NvmlSettings)
    kmsg: KmsgSettings = msgspec.field(default_factory=KmsgSettings)
    dcgm: DcgmSettings = msgspec.field(default_factory=DcgmSettings)
    rdma: RdmaSettings = msgspec.field(default_factory=RdmaSettings)
    """The node's InfiniBand and RoCE ports (agent/sources/rdma/settings.py) and the rail
    verdicts they raise on the GPUs behind them (``rdma.rails``)."""
    podresources: PodResourcesSettings = msgspec.field(default_factory=PodResourcesSettings)
    stream: StreamClientSettings = msgspec.field(default_factory=StreamClientSettings)
    remediation: AgentRemediationSettings = msgspec.field(default_factory=AgentRemediationSettings)
    """The controller's remediation orders: reset, reboot executor, validation hook
    (agent/remediation/settings.py; off by default: every order is refused)."""

    @property
    def kmsg_enabled(self) -> bool:
        return self.kmsg_path.strip().lower() != KMSG_DISABLED

    def check(self) -> None:
        try:
            parse_listen(self.listen)
        except ConfigError as exc:
            raise SettingError("listen", str(exc)) from exc
        if self.source == "sim" and self.sim_scenario is not None and not self.sim_scenario:
            raise SettingError("sim_scenario", "is empty")
        if self.nvml.shutdown_deadline_s >= self.shutdown_timeout_s:
            raise SettingError(
                "nvml.shutdown_deadline_s", "must be shorter than shutdown_timeout_s"
            )
        if self.stream.url:
            raise SettingError(
                "stream.url", "is set from controller_url (--controller-url); set that instead"
            )
        if self.controller_url is not None and not self.controller_url.startswith(
            ("ws://", "wss://")
        ):
            raise SettingError("controller_url", "must be a ws:// or wss:// URL")
        if (
            self.controller_shards > 1
            and self.controller_url is not None
            and SHARD_PLACEHOLDER not in self.controller_url
        ):
            raise SettingError(
                "controller_url",
                f"must hold {SHARD_PLACEHOLDER} with controller_shards "
                f"{self.controller_shards} (each shard has its own URL)",
            )


def default_node_name() -> str:
    return os.environ.get("NODE_NAME") or socket.gethostname()


def load_config(path: str | None, overrides: Mapping[str, Any] | None = None) -> AgentSettings:
    """The file's settings with ``overrides`` (the flags that were given) on top."""
    cfg = load_settings(AgentSettings, path, overrides)
    if not cfg.node_name:
        cfg = msgspec.structs.replace(cfg, node_name=default_node_name())
    return cfg
