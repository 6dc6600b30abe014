"""Simulator scenarios: a YAML file of faults to inject at given times on given GPUs.

```yaml
name: demo
gpus: 8
model: NVIDIA H100 80GB HBM3
poll_interval_s: 1.0
inventory_delay_s: 0     # the first inventory this late (NVML without persistence mode)
faults:
  - {at: 10, gpu: 3, xid: 79, message: "GPU has fallen off the bus."}
  - {at: 12, gpu: 5, dbe: 1}
  - {at: 15, gpu: 2, temperature: 93, for: 120}
  - {at: 20, gpu: 1, xid: 13, pid: 4242, process: python3}
```

One fault key per entry: ``xid`` (code), ``sbe`` / ``dbe`` (errors to add), ``row_remap``
(``pending`` or ``failure``), ``retired_pages_pending`` (true), ``temperature`` (°C, for a
duration), ``throttle`` (list of reasons, for a duration), ``hang`` (NVML calls time out, for
a duration), ``lost`` (GPU_IS_LOST until reset), ``missing`` (gone from the inventory),
``utilization`` (0..1, for a duration), ``nvlink_down`` (links), ``nvlink_errors`` and
``pcie_replays`` (errors to add), ``processes`` (PIDs NVML lists on the GPU, for a duration:
a GPU reset is refused while they run), ``reset`` (GPU reset; ``gpu: all`` for a reboot),
``operational_event`` (a GPU Operational Event, ``"<MODULE> <code> [key=value ...]"``:
:mod:`gpuhealth.agent.sources.sim.op_events`),
``fabric_state`` (``not-started`` or ``in-progress``: the GPU's NVLink fabric registration,
for a duration), ``fabric_health`` (health-mask flags such as ``route-unhealthy``, for a
duration), ``sxid`` (a fatal NVSwitch error of the node; ``gpu`` is ignored); and on a NIC (``nic:
<device>`` instead of ``gpu``): ``rail_down`` (true: the port is DOWN/Polling, for a duration),
``rail_flap`` (that many link-down events spread over the duration, each seen down by one
poll), ``rail_rate`` (Gb/s negotiated, for a duration), ``rail_errors`` (symbol errors per
second, for a duration). A top-level ``nics:`` list puts InfiniBand or RoCE NICs beside the
GPUs: ``{device: mlx5_0, gpus: [0, 1], link_layer: InfiniBand, rate: 400, model: MT4129}``
(one port each; the GPUs behind it by index), judged by the same rail rules as a real NIC's
(:mod:`gpuhealth.agent.health.rails`). A top-level
``fabric: <clusterUUID>.<cliqueId>`` makes every simulated GPU a registered member of that
multi-node NVLink domain (GB200 NVL72); without it the GPUs report no fabric (like HGX). A
remediation order resets a simulated GPU the same way (``agent/sources/sim/nvml.py``); a
reboot order reboots the simulated node (``agent/sources/sim/reboot.py``).
``at`` and ``for`` are seconds (a number, or ``"90s"`` / ``"2m"``). Every error names the
file, line and field and is a :class:`gpuhealth.common.errors.ConfigError`. The list was once
called ``events``; that key is still read (one of the two, not both).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from gpuhealth.agent.observations import FABRIC_HEALTH_FLAGS
from gpuhealth.common.errors import ConfigError

FaultKind = Literal[
    "xid",
    "sbe",
    "dbe",
    "row_remap",
    "retired_pages_pending",
    "temperature",
    "throttle",
    "hang",
    "lost",
    "missing",
    "utilization",
    "nvlink_down",
    "nvlink_errors",
    "pcie_replays",
    "processes",
    "reset",
    "operational_event",
    "fabric_state",
    "fabric_health",
    "sxid",
    "rail_down",
    "rail_flap",
    "rail_rate",
    "rail_errors",
]
KINDS: tuple[str, ...] = FaultKind.__args__  # type: ignore[attr-defined]
DURATION_KINDS = frozenset(
    {
        "temperature",
        "throttle",
        "hang",
        "utilization",
        "nvlink_down",
        "processes",
        "fabric_state",
        "fabric_health",
        "rail_down",
        "rail_flap",
        "rail_rate",
        "rail_errors",
    }
)
RAIL_KINDS = frozenset({"rail_down", "rail_flap", "rail_rate", "rail_errors"})
"""Faults of a NIC (``nic:``), not of a GPU."""
LINK_LAYERS = frozenset({"InfiniBand", "Ethernet"})
_NIC_KEYS = frozenset({"device", "gpus", "link_layer", "rate", "model"})
_DEVICE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
MAX_NICS = 64
FABRIC_STATES = frozenset({"not-started", "in-progress"})
_DOMAIN = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.\d{1,10}$")
THROTTLE_REASONS = frozenset(
    {"hw_thermal", "sw_thermal", "hw_slowdown", "power_cap", "hw_power_brake", "sync_boost"}
)
_COMMON = frozenset({"at", "gpu", "nic", "for", "message", "pid", "process"})
_TOP = frozenset(
    {
        "name",
        "gpus",
        "model",
        "poll_interval_s",
        "seed",
        "duration_s",
        "inventory_delay_s",
        "faults",
        "events",
        "fabric",
        "nics",
    }
)
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
MAX_GPUS = 64
DEFAULT_GPUS = 8
MAX_FAULTS = 10_000


@dataclass(frozen=True, slots=True)
class ScenarioFault:
    """One fault the simulator injects at ``at_s`` seconds into the scenario."""

    at_s: float
    gpu: int | None
    """``None``: every GPU (only for ``reset``: a node reboot), or a NIC's fault."""
    kind: FaultKind
    value: float | int | str | bool | tuple[str, ...]
    duration_s: float | None = None
    message: str = ""
    pid: int | None = None
    process: str | None = None
    line: int = 0
    nic: str | None = None
    """The NIC (``nics:`` device) of a rail fault."""


@dataclass(frozen=True, slots=True)
class ScenarioNic:
    """An InfiniBand or RoCE NIC beside the simulated GPUs (one port, number 1)."""

    device: str
    gpus: tuple[int, ...]
    """The GPUs behind it, by index."""
    link_layer: str = "InfiniBand"
    rate_gbps: float = 400.0
    model: str = "MT4129"


@dataclass(frozen=True, slots=True)
class Scenario:
    gpus: int = DEFAULT_GPUS
    model: str = "NVIDIA H100 80GB HBM3"
    poll_interval_s: float = 1.0
    name: str = "scenario"
    seed: int | None = None
    duration_s: float | None = None
    """How long the simulator runs (``None``: until cancelled)."""
    inventory_delay_s: float = 0.0
    """The simulated GPUs' first inventory (and samples) come this long after start, as NVML's
    first inventory does without persistence mode (kernel-log XIDs wait for it)."""
    faults: tuple[ScenarioFault, ...] = ()
    fabric: str | None = None
    """``<clusterUUID>.<cliqueId>``: the GPUs are members of this NVLink domain."""
    nics: tuple[ScenarioNic, ...] = ()


class _Ctx:
    def __init__(self, source: str) -> None:
        self.source = source
        self.loader = yaml.SafeLoader("")

    def fail(self, node: yaml.Node, field: str, problem: str) -> ConfigError:
        return ConfigError(f"{self.source}:{node.start_mark.line + 1}: {field}: {problem}")

    def value(self, node: yaml.Node, field: str) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            kind = "a list" if isinstance(node, yaml.SequenceNode) else "a mapping"
            raise self.fail(node, field, f"expected a single value, got {kind}")
        try:
            return self.loader.construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError, TypeError, OverflowError) as exc:
            raise self.fail(node, field, f"invalid value: {exc}") from exc

    def number(self, node: yaml.Node, field: str, *, lo: float, hi: float) -> float:
        v = self.value(node, field)
        if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
            raise self.fail(node, field, f"expected a number between {lo:g} and {hi:g}, got {v!r}")
        return float(v)

    def integer(self, node: yaml.Node, field: str, *, lo: int, hi: int) -> int:
        v = self.value(node, field)
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise self.fail(node, field, f"expected an integer between {lo} and {hi}, got {v!r}")
        return int(v)

    def seconds(self, node: yaml.Node, field: str) -> float:
        v = self.value(node, field)
        if isinstance(v, str):
            m = _DURATION.match(v)
            if m is None:
                raise self.fail(node, field, f"expected seconds like 30, '90s' or '2m', got {v!r}")
            v = float(m.group(1)) * _UNITS[m.group(2)]
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 10**7:
            raise self.fail(node, field, f"expected seconds between 0 and 1e7, got {v!r}")
        return float(v)

    def text(self, node: yaml.Node, field: str, *, max_len: int = 256) -> str:
        v = self.value(node, field)
        if not isinstance(v, str | int | float) or isinstance(v, bool) or len(str(v)) > max_len:
            raise self.fail(node, field, f"expected text of at most {max_len} characters")
        return str(v)


def _pairs(ctx: _Ctx, node: yaml.Node, field: str) -> list[tuple[str, yaml.Node, yaml.Node]]:
    if not isinstance(node, yaml.MappingNode):
        raise ctx.fail(node, field, "expected a mapping")
    out, seen = [], set()
    for k, v in node.value:
        key = ctx.value(k, field + " key")
        if not isinstance(key, str):
            raise ctx.fail(k, field, f"keys must be text, got {key!r}")
        if key in seen:
            raise ctx.fail(k, f"{field}.{key}" if field else key, "duplicate key")
        seen.add(key)
        out.append((key, k, v))
    return out


def _fabric_value(ctx: _Ctx, kind: str, vnode: yaml.Node, f: str) -> str | tuple[str, ...]:
    """``fabric_state``: one registration state; ``fabric_health``: health-mask flags."""
    if kind == "fabric_state":
        state = ctx.value(vnode, f)
        if state not in FABRIC_STATES:
            raise ctx.fail(vnode, f, f"expected one of {sorted(FABRIC_STATES)}, got {state!r}")
        return str(state)
    if not isinstance(vnode, yaml.SequenceNode) or not vnode.value:
        raise ctx.fail(vnode, f, f"expected a non-empty list of {sorted(FABRIC_HEALTH_FLAGS)}")
    flags = tuple(ctx.text(n, f) for n in vnode.value)
    bad = [x for x in flags if x not in FABRIC_HEALTH_FLAGS]
    if bad:
        raise ctx.fail(vnode, f, f"unknown fabric health flag {bad[0]!r}")
    return flags


def _kind_value(
    ctx: _Ctx, kind: str, vnode: yaml.Node, f: str
) -> float | int | str | bool | tuple[str, ...]:
    value: float | int | str | bool | tuple[str, ...]
    if kind == "xid":
        value = ctx.integer(vnode, f, lo=1, hi=65535)
    elif kind in ("sbe", "dbe", "nvlink_errors", "pcie_replays"):
        value = ctx.integer(vnode, f, lo=1, hi=10**9)
    elif kind == "nvlink_down":
        value = ctx.integer(vnode, f, lo=1, hi=18)
    elif kind == "sxid":
        value = ctx.integer(vnode, f, lo=1, hi=999_999)
    elif kind == "rail_flap":
        value = ctx.integer(vnode, f, lo=1, hi=255)
    elif kind == "rail_rate":
        value = ctx.number(vnode, f, lo=1, hi=100_000)
    elif kind == "rail_errors":
        value = ctx.number(vnode, f, lo=0.001, hi=1e6)
    elif kind in ("fabric_state", "fabric_health"):
        value = _fabric_value(ctx, kind, vnode, f)
    elif kind == "temperature":
        value = ctx.number(vnode, f, lo=-40, hi=150)
    elif kind == "utilization":
        value = ctx.number(vnode, f, lo=0, hi=1)
    elif kind == "row_remap":
        value = ctx.value(vnode, f)
        if value not in ("pending", "failure"):
            raise ctx.fail(vnode, f, f"expected 'pending' or 'failure', got {value!r}")
    elif kind == "throttle":
        if not isinstance(vnode, yaml.SequenceNode) or not vnode.value:
            raise ctx.fail(vnode, f, f"expected a non-empty list of {sorted(THROTTLE_REASONS)}")
        reasons = tuple(ctx.text(n, f) for n in vnode.value)
        bad = [r for r in reasons if r not in THROTTLE_REASONS]
        if bad:
            raise ctx.fail(vnode, f, f"unknown throttle reason {bad[0]!r}")
        value = reasons
    elif kind == "processes":
        if not isinstance(vnode, yaml.SequenceNode) or not vnode.value:
            raise ctx.fail(vnode, f, "expected a non-empty list of PIDs")
        value = tuple(str(ctx.integer(n, f, lo=1, hi=2**31 - 1)) for n in vnode.value)
    elif kind == "operational_event":
        from gpuhealth.agent.sources.sim.op_events import SpecError, parse_spec

        try:
            value = parse_spec(ctx.text(vnode, f))
        except SpecError as exc:
            raise ctx.fail(vnode, f, str(exc)) from None
    else:  # retired_pages_pending, hang, lost, missing, reset, rail_down: a flag
        value = ctx.value(vnode, f)
        if value is not True:
            raise ctx.fail(vnode, f, f"expected true, got {value!r}")
    return value


def _fault(
    ctx: _Ctx, node: yaml.Node, key: str, pos: int, *, gpus: int, nics: frozenset[str]
) -> ScenarioFault:
    where = f"{key}[{pos}]"
    fields = {key: (knode, vnode) for key, knode, vnode in _pairs(ctx, node, where)}
    unknown = [k for k in fields if k not in _COMMON and k not in KINDS]
    if unknown:
        raise ctx.fail(fields[unknown[0]][0], f"{where}.{unknown[0]}", "unknown field")
    kinds = [k for k in fields if k in KINDS]
    if len(kinds) != 1:
        raise ctx.fail(
            node, where, f"needs exactly one of {', '.join(KINDS)}; got {kinds or 'none'}"
        )
    kind = kinds[0]
    if "at" not in fields:
        raise ctx.fail(node, f"{where}.at", "missing (seconds from the start)")
    at_s = ctx.seconds(fields["at"][1], f"{where}.at")
    gpu: int | None = None
    nic: str | None = None
    if kind in RAIL_KINDS:
        nic = _fault_nic(ctx, node, fields, where, nics)
    elif "gpu" not in fields:
        raise ctx.fail(node, f"{where}.gpu", "missing (a GPU index, or 'all' for reset)")
    elif "nic" in fields:
        raise ctx.fail(fields["nic"][0], f"{where}.nic", f"not allowed with {kind}")
    elif kind == "reset" and ctx.value(fields["gpu"][1], f"{where}.gpu") == "all":
        gpu = None
    else:
        gpu = ctx.integer(fields["gpu"][1], f"{where}.gpu", lo=0, hi=gpus - 1)
    value = _kind_value(ctx, kind, fields[kind][1], f"{where}.{kind}")
    duration = None
    if "for" in fields:
        if kind not in DURATION_KINDS:
            raise ctx.fail(fields["for"][0], f"{where}.for", f"not allowed with {kind}")
        duration = ctx.seconds(fields["for"][1], f"{where}.for")
    elif kind in DURATION_KINDS and kind != "utilization":
        raise ctx.fail(node, f"{where}.for", f"missing: {kind} needs a duration")
    pid = ctx.integer(fields["pid"][1], f"{where}.pid", lo=0, hi=2**31) if "pid" in fields else None
    proc = ctx.text(fields["process"][1], f"{where}.process") if "process" in fields else None
    msg = (
        ctx.text(fields["message"][1], f"{where}.message", max_len=512)
        if "message" in fields
        else ""
    )
    return ScenarioFault(
        at_s=at_s,
        gpu=gpu,
        kind=kind,  # type: ignore[arg-type]
        value=value,
        duration_s=duration,
        message=msg,
        pid=pid,
        process=proc,
        line=node.start_mark.line + 1,
        nic=nic,
    )


def _fault_nic(
    ctx: _Ctx,
    node: yaml.Node,
    fields: dict[str, tuple[yaml.Node, yaml.Node]],
    where: str,
    nics: frozenset[str],
) -> str:
    """A rail fault's ``nic``: a device of the top-level ``nics:`` (no ``gpu``)."""
    if "gpu" in fields:
        raise ctx.fail(fields["gpu"][0], f"{where}.gpu", "a rail fault names its nic, not a gpu")
    if "nic" not in fields:
        raise ctx.fail(node, f"{where}.nic", "missing (a device of the top-level nics)")
    nic = ctx.text(fields["nic"][1], f"{where}.nic", max_len=64)
    if nic not in nics:
        raise ctx.fail(fields["nic"][1], f"{where}.nic", f"no NIC {nic!r} in nics")
    return nic


def _nics(ctx: _Ctx, node: yaml.Node, gpus: int) -> tuple[ScenarioNic, ...]:
    """The top-level ``nics:`` list."""
    if not isinstance(node, yaml.SequenceNode):
        raise ctx.fail(node, "nics", "expected a list of NICs")
    if len(node.value) > MAX_NICS:
        raise ctx.fail(node, "nics", f"more than {MAX_NICS} NICs")
    out: list[ScenarioNic] = []
    for pos, item in enumerate(node.value):
        where = f"nics[{pos}]"
        fields = {k: (kn, vn) for k, kn, vn in _pairs(ctx, item, where)}
        for k, (kn, _) in fields.items():
            if k not in _NIC_KEYS:
                raise ctx.fail(kn, f"{where}.{k}", f"unknown field (known: {sorted(_NIC_KEYS)})")
        if "device" not in fields or "gpus" not in fields:
            raise ctx.fail(item, where, "needs device and gpus")
        device = ctx.text(fields["device"][1], f"{where}.device", max_len=64)
        if not _DEVICE.match(device) or any(n.device == device for n in out):
            raise ctx.fail(fields["device"][1], f"{where}.device", f"bad or repeated {device!r}")
        gnode = fields["gpus"][1]
        if not isinstance(gnode, yaml.SequenceNode):
            raise ctx.fail(gnode, f"{where}.gpus", "expected a list of GPU indexes")
        behind = tuple(ctx.integer(n, f"{where}.gpus", lo=0, hi=gpus - 1) for n in gnode.value)
        kw: dict[str, Any] = {}
        if "link_layer" in fields:
            layer = ctx.value(fields["link_layer"][1], f"{where}.link_layer")
            if layer not in LINK_LAYERS:
                raise ctx.fail(
                    fields["link_layer"][1], f"{where}.link_layer", f"one of {sorted(LINK_LAYERS)}"
                )
            kw["link_layer"] = layer
        if "rate" in fields:
            kw["rate_gbps"] = ctx.number(fields["rate"][1], f"{where}.rate", lo=1, hi=100_000)
        if "model" in fields:
            kw["model"] = ctx.text(fields["model"][1], f"{where}.model", max_len=64)
        out.append(ScenarioNic(device=device, gpus=behind, **kw))
    return tuple(out)


def _compose(text: str, source: str) -> yaml.Node:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{source}{line}: invalid YAML: {exc.problem or exc}") from exc
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        raise ConfigError(f"{source}: invalid YAML: {exc}") from exc
    if root is None:
        raise ConfigError(f"{source}: empty scenario")
    return root


def parse_scenario(text: str, source: str = "<scenario>") -> Scenario:
    """Parse scenario YAML; every problem is a ConfigError naming the line and field."""
    ctx = _Ctx(source)
    top = {key: (knode, vnode) for key, knode, vnode in _pairs(ctx, _compose(text, source), "")}
    for key, (knode, _) in top.items():
        if key not in _TOP:
            raise ctx.fail(knode, key, f"unknown field (known: {', '.join(sorted(_TOP))})")
    kw: dict[str, Any] = {}
    if "gpus" in top:
        kw["gpus"] = ctx.integer(top["gpus"][1], "gpus", lo=1, hi=MAX_GPUS)
    if "model" in top:
        kw["model"] = ctx.text(top["model"][1], "model", max_len=128)
    if "name" in top:
        kw["name"] = ctx.text(top["name"][1], "name", max_len=128)
    if "poll_interval_s" in top:
        kw["poll_interval_s"] = ctx.number(
            top["poll_interval_s"][1], "poll_interval_s", lo=0.01, hi=3600
        )
    if "seed" in top:
        kw["seed"] = ctx.integer(top["seed"][1], "seed", lo=0, hi=2**63)
    if "duration_s" in top:
        kw["duration_s"] = ctx.seconds(top["duration_s"][1], "duration_s")
    if "inventory_delay_s" in top:
        kw["inventory_delay_s"] = ctx.seconds(top["inventory_delay_s"][1], "inventory_delay_s")
    if "fabric" in top:
        fabric = ctx.text(top["fabric"][1], "fabric", max_len=63)
        if not _DOMAIN.match(fabric):
            raise ctx.fail(top["fabric"][1], "fabric", "expected <clusterUUID>.<cliqueId>")
        kw["fabric"] = fabric
    gpus = kw.get("gpus", DEFAULT_GPUS)
    if "nics" in top:
        kw["nics"] = _nics(ctx, top["nics"][1], gpus)
    devices = frozenset(n.device for n in kw.get("nics", ()))
    if "faults" in top and "events" in top:
        raise ctx.fail(top["events"][0], "events", "give faults or (the older name) events")
    faults: list[ScenarioFault] = []
    key = "faults" if "faults" in top else "events"
    if key in top:
        fnode = top[key][1]
        if not isinstance(fnode, yaml.SequenceNode):
            raise ctx.fail(fnode, key, "expected a list of faults")
        if len(fnode.value) > MAX_FAULTS:
            raise ctx.fail(fnode, key, f"more than {MAX_FAULTS} faults")
        faults = [
            _fault(ctx, n, key, i, gpus=gpus, nics=devices) for i, n in enumerate(fnode.value)
        ]
    faults.sort(key=lambda f: f.at_s)
    return Scenario(faults=tuple(faults), **kw)


def load_scenario(path: str | Path) -> Scenario:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read scenario: {exc}") from exc
    return parse_scenario(text, str(p))
