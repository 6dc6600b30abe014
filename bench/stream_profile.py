"""What an agent sends on its stream, as numbers (pure): its messages' types, sizes and rates,
what changes from one Heartbeat to the next, and how two such profiles differ.

A profile is computed from the frames one stream carried (:class:`Frame`: when it arrived and
its bytes, as :mod:`bench.stream_recording` records them from the real ``gpuhealth-agent`` or
from the fleet benchmark's simulated agents), so the simulated agents can be held to the real
agent's shape (:func:`differences`): the same message types, sizes within a tolerance, the
same Heartbeat fields changing, as many usage and telemetry entries per Heartbeat, the same
Heartbeat interval, and drifting figures in the same ranges.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpuhealth.protocol import AllocationUsage, GpuTelemetry, Heartbeat
from gpuhealth.protocol.codec import decode_agent

CHANGING = 0.5
"""A Heartbeat field "changes" when it differs between consecutive Heartbeats in at least this
fraction of the pairs (per GPU for telemetry, per allocation for usage)."""
TOLERANCE = 0.2
"""How far the simulated agents' sizes, interval and figures may be from the real agent's
(a fraction of the real one's)."""
_TELEMETRY = tuple(f for f in GpuTelemetry.__struct_fields__ if f != "uuid")
_USAGE = ("utilization_ratio", "samples", "attribution")
DRIFTING = ("temperature_c", "power_w", "utilization_ratio", "memory_bandwidth_ratio")
"""The telemetry figures whose ranges are compared."""


@dataclass(frozen=True, slots=True)
class Frame:
    """One binary frame an agent sent: when it arrived (monotonic seconds) and its bytes."""

    at: float
    data: bytes


@dataclass(frozen=True, slots=True)
class TypeProfile:
    """The messages of one type: how many, their encoded sizes, how often."""

    count: int
    bytes_median: float
    bytes_min: int
    bytes_max: int
    per_minute: float
    """Over the whole recording."""
    interval_s: float | None
    """Median time between two consecutive ones (None: fewer than two)."""


@dataclass(frozen=True, slots=True)
class StreamProfile:
    seconds: float
    """From the first frame to the last."""
    types: dict[str, TypeProfile]
    opening: tuple[str, ...]
    """The message types in order before the first Heartbeat (Hello, Snapshot, ...)."""
    steady: dict[str, int]
    """Messages of each type from the first Heartbeat on."""
    telemetry_per_heartbeat: float
    usage_per_heartbeat: float
    changed: dict[str, float] = field(default_factory=dict)
    """Per Heartbeat field (``at``, ``telemetry.<field>``, ``usage.<field>``): the fraction of
    consecutive pairs in which it changed."""
    ranges: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    """Per drifting telemetry figure: (min, median, max) over every GPU and Heartbeat."""

    def changing(self) -> frozenset[str]:
        """The Heartbeat fields that change (:data:`CHANGING`)."""
        return frozenset(k for k, v in self.changed.items() if v >= CHANGING)


def _type(msg: object) -> str:
    tag = type(msg).__struct_config__.tag  # type: ignore[attr-defined]
    return str(tag)


def profile(frames: Sequence[Frame]) -> StreamProfile:
    """The profile of one stream's frames (in the order they arrived)."""
    if not frames:
        raise ValueError("no frames")
    msgs = [(f.at, len(f.data), decode_agent(f.data)) for f in frames]
    seconds = msgs[-1][0] - msgs[0][0]
    by_type: dict[str, list[tuple[float, int]]] = {}
    for at, size, msg in msgs:
        by_type.setdefault(_type(msg), []).append((at, size))
    types = {k: _type_profile(v, seconds) for k, v in by_type.items()}
    first_beat = next((i for i, (_, _, m) in enumerate(msgs) if isinstance(m, Heartbeat)), None)
    cut = len(msgs) if first_beat is None else first_beat
    steady: dict[str, int] = {}
    for _, _, m in msgs[cut:]:
        steady[_type(m)] = steady.get(_type(m), 0) + 1
    beats = [m for _, _, m in msgs if isinstance(m, Heartbeat)]
    return StreamProfile(
        seconds=seconds,
        types=types,
        opening=tuple(_type(m) for _, _, m in msgs[:cut]),
        steady=steady,
        telemetry_per_heartbeat=statistics.median(len(b.telemetry) for b in beats)
        if beats
        else 0.0,
        usage_per_heartbeat=statistics.median(len(b.usage) for b in beats) if beats else 0.0,
        changed=_changed(beats),
        ranges=_ranges(beats),
    )


def _type_profile(seen: Sequence[tuple[float, int]], seconds: float) -> TypeProfile:
    sizes = [s for _, s in seen]
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(seen)]
    return TypeProfile(
        count=len(seen),
        bytes_median=statistics.median(sizes),
        bytes_min=min(sizes),
        bytes_max=max(sizes),
        per_minute=60.0 * len(seen) / seconds if seconds > 0 else 0.0,
        interval_s=statistics.median(gaps) if gaps else None,
    )


def _usage_key(u: AllocationUsage) -> tuple[str, str, str, str]:
    return (u.namespace, u.pod, u.container, u.gpu_uuid)


def _changed(beats: Sequence[Heartbeat]) -> dict[str, float]:
    pairs: dict[str, list[bool]] = {}

    def note(name: str, before: object, after: object) -> None:
        pairs.setdefault(name, []).append(before != after)

    for a, b in itertools.pairwise(beats):
        note("at", a.at, b.at)
        previous = {t.uuid: t for t in a.telemetry}
        for t in b.telemetry:
            old = previous.get(t.uuid)
            if old is not None:
                for f in _TELEMETRY:
                    note(f"telemetry.{f}", getattr(old, f), getattr(t, f))
        used = {_usage_key(u): u for u in a.usage}
        for u in b.usage:
            was = used.get(_usage_key(u))
            if was is not None:
                for f in _USAGE:
                    note(f"usage.{f}", getattr(was, f), getattr(u, f))
    return {k: sum(v) / len(v) for k, v in sorted(pairs.items())}


def _ranges(beats: Iterable[Heartbeat]) -> dict[str, tuple[float, float, float]]:
    values: dict[str, list[float]] = {}
    for b in beats:
        for t in b.telemetry:
            for f in DRIFTING:
                v = getattr(t, f)
                if v is not None:
                    values.setdefault(f, []).append(float(v))
    return {k: (min(v), statistics.median(v), max(v)) for k, v in values.items()}


def _near(sim: float, real: float, tolerance: float) -> bool:
    return abs(sim - real) <= tolerance * abs(real)


def _collapsed(opening: Sequence[str]) -> tuple[str, ...]:
    """The opening with each run of Snapshots as one: the real agent's first PodResources
    answer may come a moment after its first Snapshot, which it then follows with another."""
    return tuple(
        t
        for i, t in enumerate(opening)
        if not (t == "snapshot" and i > 0 and opening[i - 1] == "snapshot")
    )


def differences(real: StreamProfile, sim: StreamProfile, tolerance: float = TOLERANCE) -> list[str]:
    """How ``sim`` differs from ``real`` (empty: the same shape): the steady message types, the
    opening (:func:`_collapsed`), each type's largest size and each steady type's median size
    and the Heartbeat interval within ``tolerance``, the same Heartbeat fields changing, as
    many telemetry and usage entries per Heartbeat, and each drifting figure's median inside
    the real one's range (widened by ``tolerance`` of its median)."""
    out: list[str] = []
    if set(real.steady) != set(sim.steady):
        out.append(f"steady message types: real {sorted(real.steady)}, sim {sorted(sim.steady)}")
    if _collapsed(real.opening) != _collapsed(sim.opening):
        out.append(f"opening: real {real.opening}, sim {sim.opening}")
    for name in sorted(set(real.types) & set(sim.types)):
        r, s = real.types[name], sim.types[name]
        if not _near(s.bytes_max, r.bytes_max, tolerance):
            out.append(f"largest {name}: real {r.bytes_max} bytes, sim {s.bytes_max} bytes")
        if name in real.steady and not _near(s.bytes_median, r.bytes_median, tolerance):
            out.append(f"{name} size: real {r.bytes_median:g} bytes, sim {s.bytes_median:g} bytes")
    out += _heartbeat_differences(real, sim, tolerance)
    return out


def _heartbeat_differences(real: StreamProfile, sim: StreamProfile, tolerance: float) -> list[str]:
    out: list[str] = []
    r_beat, s_beat = real.types.get("heartbeat"), sim.types.get("heartbeat")
    r_gap = r_beat.interval_s if r_beat is not None else None
    s_gap = s_beat.interval_s if s_beat is not None else None
    if r_gap is not None and (s_gap is None or not _near(s_gap, r_gap, tolerance)):
        out.append(f"heartbeat interval: real {r_gap:.2f} s, sim {s_gap} s")
    if real.changing() != sim.changing():
        out.append(
            f"changing heartbeat fields: real {sorted(real.changing())}, "
            f"sim {sorted(sim.changing())}"
        )
    for what in ("telemetry_per_heartbeat", "usage_per_heartbeat"):
        r, s = getattr(real, what), getattr(sim, what)
        if r != s:
            out.append(f"{what}: real {r:g}, sim {s:g}")
    out += _range_differences(real.ranges, sim.ranges, tolerance)
    return out


def _range_differences(
    real: Mapping[str, tuple[float, float, float]],
    sim: Mapping[str, tuple[float, float, float]],
    tolerance: float,
) -> list[str]:
    out: list[str] = []
    for name, (lo, median, hi) in sorted(real.items()):
        got = sim.get(name)
        slack = tolerance * abs(median)
        if got is None or not lo - slack <= got[1] <= hi + slack:
            seen = "none" if got is None else f"{got[1]:g}"
            out.append(f"{name}: real {lo:g}..{hi:g}, sim median {seen}")
    return out
