"""The agent's configuration: a YAML file (``--config``) with command-line flags on top.

Every interval, timeout and threshold is a named field here or in the nested settings
(health, sources, pod attribution, stream), each with its production default. A file key
that does not exist, or a value of the wrong type, is a :class:`ConfigError` naming the
file, line and field.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import msgspec
import yaml

from agent.health import HealthSettings
from agent.podresources.mapping import PodResourcesSettings
from agent.sources.dcgm import DcgmSettings
from agent.sources.kmsg import KmsgSettings
from agent.sources.nvml import NvmlSettings
from agent.stream.settings import StreamClientSettings
from common.errors import ConfigError

SourceKind = Literal["nvml", "dcgm-exporter", "sim"]
LogFormat = Literal["auto", "json", "console"]
KMSG_DISABLED = "none"


class AgentConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    node_name: str = ""
    """The Kubernetes node this agent speaks for; empty = ``$NODE_NAME``, else the hostname."""
    source: SourceKind = "nvml"
    """Where GPU telemetry comes from: NVML, a node-local dcgm-exporter, or the simulator."""
    sim_scenario: str | None = None
    """Scenario YAML for ``source: sim`` (None: healthy GPUs, no faults)."""
    sim_seed: int = 0
    """Seed of the simulator's baseline noise (same seed, same run)."""
    kmsg_path: str = "/dev/kmsg"
    """Kernel log to follow for ``NVRM: Xid`` lines (a file or FIFO in tests); ``none`` disables."""
    listen: str = "0.0.0.0:9400"
    """HOST:PORT of /metrics, /healthz, /readyz and /api/v1/status."""
    controller_url: str | None = None
    """``wss://…/v1/stream`` of the controller; None runs the agent stand-alone."""
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
    log_level: str = "info"
    tick_interval_s: float = 1.0
    """How often the health engine re-evaluates time-based rules (clean windows, staleness)."""
    shutdown_timeout_s: float = 5.0
    """How long SIGTERM waits for tasks to stop before giving up on them."""
    health: HealthSettings = msgspec.field(default_factory=HealthSettings)
    nvml: NvmlSettings = msgspec.field(default_factory=NvmlSettings)
    kmsg: KmsgSettings = msgspec.field(default_factory=KmsgSettings)
    dcgm: DcgmSettings = msgspec.field(default_factory=DcgmSettings)
    podresources: PodResourcesSettings = msgspec.field(default_factory=PodResourcesSettings)
    stream: StreamClientSettings = msgspec.field(default_factory=StreamClientSettings)

    @property
    def kmsg_enabled(self) -> bool:
        return self.kmsg_path.strip().lower() != KMSG_DISABLED


def default_node_name() -> str:
    return os.environ.get("NODE_NAME") or socket.gethostname()


def _line_of(text: str, path: str) -> int | None:
    """The 1-based line of a ``$.a.b[2]`` path in YAML text, when it can be found."""
    try:
        node: Any = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    keys = [k for k in path.removeprefix("$").replace("[", ".").replace("]", "").split(".") if k]
    line = node.start_mark.line + 1 if node is not None else None
    for key in keys:
        if isinstance(node, yaml.MappingNode):
            match = [(k, v) for k, v in node.value if k.value == key]
            if not match:
                return line
            line = match[0][0].start_mark.line + 1
            node = match[0][1]
        elif isinstance(node, yaml.SequenceNode) and key.isdigit() and int(key) < len(node.value):
            node = node.value[int(key)]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def _read_file(path: str) -> tuple[dict[str, Any], str]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror or exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path}: not valid YAML: {exc}") from exc
    if data is None:
        return {}, text
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: the top level must be a mapping")
    return data, text


def load_config(path: str | None, overrides: Mapping[str, Any] | None = None) -> AgentConfig:
    """The file's settings with ``overrides`` (the flags that were given) on top."""
    data: dict[str, Any] = {}
    text = ""
    if path:
        data, text = _read_file(path)
    for key, value in (overrides or {}).items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        elif value is not None:
            data[key] = value
    try:
        cfg = msgspec.convert(data, AgentConfig, strict=False)
    except msgspec.ValidationError as exc:
        message = str(exc)
        where = path or "flags"
        field_path = message.rpartition(" - at `")[2].rstrip("`") if " - at `" in message else "$"
        unknown = re.search(r"unknown field `([^`]*)`", message)
        if unknown:
            field_path += "." + unknown.group(1)
        line = _line_of(text, field_path) if text else None
        loc = f"{where}:{line}" if line else where
        raise ConfigError(f"{loc}: {message}") from exc
    if not cfg.node_name:
        cfg = msgspec.structs.replace(cfg, node_name=default_node_name())
    if cfg.source == "sim" and cfg.sim_scenario is not None and not cfg.sim_scenario:
        raise ConfigError("--sim-scenario is empty")
    return cfg
