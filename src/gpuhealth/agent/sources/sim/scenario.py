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
duration), ``sxid`` (a fatal NVSwitch error of the node; ``gpu`` is ignored). A top-level
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
    }
)
FABRIC_STATES = frozenset({"not-started", "in-progress"})
_DOMAIN = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.\d{1,10}$")
THROTTLE_REASONS = frozenset(
    {"hw_thermal", "sw_thermal", "hw_slowdown", "power_cap", "hw_power_brake", "sync_boost"}
)
_COMMON = frozenset({"at", "gpu", "for", "message", "pid", "process"})
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
    """``None``: every GPU (only for ``reset``: a node reboot)."""
    kind: FaultKind
    value: float | int | str | bool | tuple[str, ...]
    duration_s: float | None = None
    message: str = ""
    pid: int | None = None
    process: str | None = None
    line: int = 0


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
    else:  # retired_pages_pending, hang, lost, missing, reset: a flag
        value = ctx.value(vnode, f)
        if value is not True:
            raise ctx.fail(vnode, f, f"expected true, got {value!r}")
    return value


def _fault(ctx: _Ctx, node: yaml.Node, key: str, pos: int, gpus: int) -> ScenarioFault:
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
    if "gpu" not in fields:
        raise ctx.fail(node, f"{where}.gpu", "missing (a GPU index, or 'all' for reset)")
    at_s = ctx.seconds(fields["at"][1], f"{where}.at")
    gnode = fields["gpu"][1]
    gpu: int | None
    if kind == "reset" and ctx.value(gnode, f"{where}.gpu") == "all":
        gpu = None
    else:
        gpu = ctx.integer(gnode, f"{where}.gpu", lo=0, hi=gpus - 1)
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
    )


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
        faults = [_fault(ctx, n, key, i, gpus) for i, n in enumerate(fnode.value)]
    faults.sort(key=lambda f: f.at_s)
    return Scenario(faults=tuple(faults), **kw)


def load_scenario(path: str | Path) -> Scenario:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read scenario: {exc}") from exc
    return parse_scenario(text, str(p))
