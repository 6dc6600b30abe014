"""Rail verdicts: what the InfiniBand and RoCE ports beside the GPUs mean for them (pure).

A *rail* is a NIC port with the GPUs behind it by PCIe topology (the RDMA source pairs them,
:mod:`gpuhealth.agent.sources.rdma.topology`). One port's :class:`RailTracker` judges its polls
(:class:`~gpuhealth.agent.observations.NicPortSample`) with the same hysteresis as the GPU
sample rules (:class:`~gpuhealth.agent.health.hysteresis.Hysteresis`): ``rail-down``,
``rail-degraded-rate`` and ``rail-errors`` are raised after ``raise_after_samples`` bad polls
and cleared after ``clean_window_s`` without one; ``rail-flapping`` holds while
``flap_threshold`` flaps lie within ``flap_window_s``. The :class:`RailBook` keeps every port
of the node and says which conditions each GPU carries (the health engine puts them on the
GPUs: :mod:`gpuhealth.agent.health.engine`).

Missing data never raises a verdict: a state that could not be read is not judged, a counter
that went backwards was reset (no growth that poll, never a huge one), a counter stuck at its
maximum (the InfiniBand port counters stop there) is not judged, a port never seen up is
never "down", and a port that is gone takes its verdicts with it. No I/O; time comes in as
``now`` (monotonic seconds) and ``at`` (wall time).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

import msgspec

from gpuhealth.agent.health.hysteresis import Hysteresis
from gpuhealth.agent.health.rail_settings import LINK_DOWNED, RailSettings
from gpuhealth.agent.health.rules import (
    RAIL_DEGRADED_RATE,
    RAIL_DOWN,
    RAIL_ERRORS,
    RAIL_FLAPPING,
    RAIL_VERDICTS,
    Verdict,
)
from gpuhealth.agent.observations import NicObservation, NicPortSample, PciAddress, SourceName
from gpuhealth.protocol import Condition

RAIL_SCOPE = "rail"
"""The ``scope`` of a rail condition: the fault is the network port's, not the GPU's."""
RAIL_CODES = frozenset(v.code for v in RAIL_VERDICTS)
MAX_MESSAGE = 1024

PortKey = tuple[str, int]
"""(RDMA device, port number)."""


@dataclass(frozen=True, slots=True, order=True)
class RailGpu:
    """A GPU behind a port, as the engine knows it."""

    index: int
    uuid: str


@dataclass(frozen=True, slots=True)
class RailStatus:
    """One port as the agent judges it now: what /metrics, /api/v1/status and the stream's
    Snapshot show of it."""

    sample: NicPortSample
    expected_rate_gbps: float | None
    flaps: int
    """Flaps within ``flap_window_s``."""
    flaps_total: int
    """Flaps counted since the agent started."""
    last_flap: datetime | None
    verdicts: tuple[Condition, ...]
    """The port's active rail verdicts (each GPU behind it carries them too)."""
    gpus: tuple[RailGpu, ...]
    """The GPUs behind it the engine knows."""


def count_flaps(observed: bool, downed: int | None, carry: int) -> tuple[int, int]:
    """The flaps of one poll, each link-down event counted once, and the carry for the next.

    ``observed``: the poll saw the port go from up to not up. ``downed``: how much
    ``link_downed`` grew since the previous poll (None: not readable, reset, or the first
    poll). ``carry``: a down the previous poll saw that the counter did not show yet (it may
    show now, and is then the same event). The poll's observed down and the counter's growth
    are the same events where they overlap; a counter that shows more counts the downs no
    poll saw."""
    if downed is None:
        return int(observed), 0
    rest = downed - min(carry, downed)
    return max(int(observed), rest), int(observed and rest == 0)


def expected_rates(
    ports: Iterable[NicPortSample], settings: RailSettings
) -> dict[PortKey, float | None]:
    """Each port's expected rate: its model's setting, else the most common rate among the
    node's up ports of its link layer; None when two rates are equally common (no verdict)."""
    ports = list(ports)
    rates: dict[str, Counter[float]] = {}
    for p in ports:
        if p.up and p.rate_gbps is not None:
            rates.setdefault(p.link_layer, Counter())[p.rate_gbps] += 1
    modes: dict[str, float | None] = {}
    for layer, counts in rates.items():
        top = counts.most_common(2)
        modes[layer] = None if len(top) > 1 and top[0][1] == top[1][1] else top[0][0]
    out: dict[PortKey, float | None] = {}
    for p in ports:
        configured = settings.expected_rate_gbps.get(p.model) if p.model else None
        out[(p.device, p.port)] = configured if configured is not None else modes.get(p.link_layer)
    return out


def describe_port(p: NicPortSample) -> str:
    """``mlx5_0 port 1 (InfiniBand)``, ``mlx5_bond_0 port 1 (Ethernet, bond0)``."""
    what = ", ".join(x for x in (p.link_layer, p.netdev) if x)
    return f"{p.device} port {p.port}" + (f" ({what})" if what else "")


def _hysteresis(s: RailSettings) -> Hysteresis:
    return Hysteresis(raise_after=s.raise_after_samples, clear_after_s=s.clean_window_s)


class RailTracker:
    """One port between polls: its hysteresis, counter baselines and flap window."""

    __slots__ = (
        "carry", "down", "errors", "expected", "flap_count", "flaps", "flaps_total",
        "last", "last_flap", "last_mono", "raised", "rate", "s", "sample", "seen_up",
        "severity", "was_up",
    )  # fmt: skip

    def __init__(self, settings: RailSettings) -> None:
        self.s = settings
        self.severity = {
            RAIL_DOWN.code: settings.down_severity,
            RAIL_FLAPPING.code: settings.flapping_severity,
            RAIL_DEGRADED_RATE.code: settings.rate_severity,
            RAIL_ERRORS.code: settings.errors_severity,
        }
        self.sample: NicPortSample | None = None
        self.expected: float | None = None
        self.seen_up = False
        """The port was ACTIVE and LinkUp at a poll since the agent started."""
        self.was_up: bool | None = None
        self.down = _hysteresis(settings)
        self.rate = _hysteresis(settings)
        self.errors = _hysteresis(settings)
        self.flaps: deque[tuple[float, int]] = deque()
        """(monotonic time, flaps) within the window."""
        self.flap_count = 0
        self.flaps_total = 0
        self.last_flap: datetime | None = None
        self.carry = 0
        self.last: dict[str, int] = {}
        self.last_mono: float | None = None
        self.raised: dict[str, Condition] = {}
        """Active verdicts, each with the message and ``since`` of when it was raised."""

    def update(self, smp: NicPortSample, expected: float | None, now: float, at: datetime) -> int:
        """Judge one poll; the number of counters that went backwards (resets)."""
        dt = now - self.last_mono if self.last_mono is not None else 0.0
        growth: dict[str, int | None] = {}
        resets = 0
        for name, value in smp.counters.items():
            before = self.last.get(name)
            if before is None:
                continue
            if value < before:
                resets += 1
                growth[name] = None
            else:
                growth[name] = value - before
        up = smp.up
        port = describe_port(smp)
        flaps, self.carry = count_flaps(
            bool(self.was_up) and up is False, growth.get(LINK_DOWNED), self.carry
        )
        if flaps:
            self.flaps.append((now, flaps))
            self.flap_count += flaps
            self.flaps_total += flaps
            self.last_flap = at
        if up:
            self.seen_up = True
        if up is not None:
            if self.seen_up:
                self._judge(
                    RAIL_DOWN,
                    self.down,
                    not up,
                    lambda: f"{port} is {smp.port_state}/{smp.phys_state} (it was ACTIVE/LinkUp)",
                    now=now,
                    at=at,
                )
            self.was_up = up
        rate = smp.rate_gbps
        if up and rate is not None and expected is not None:
            self._judge(
                RAIL_DEGRADED_RATE,
                self.rate,
                rate < expected,
                lambda: f"{port} runs at {rate:g} Gb/s, below the expected {expected:g} Gb/s",
                now=now,
                at=at,
            )
        if dt > 0:
            self._judge_errors(smp, growth, dt=dt, now=now, at=at)
        self._judge_flaps(now, at, port)
        self.last = dict(smp.counters)
        self.last_mono = now
        self.sample = smp
        self.expected = expected
        return resets

    def _judge_errors(
        self,
        smp: NicPortSample,
        growth: Mapping[str, int | None],
        *,
        dt: float,
        now: float,
        at: datetime,
    ) -> None:
        limits: dict[str, float] = dict(self.s.error_rates_per_s.items())
        per_s = {
            name: g / dt
            for name, g in growth.items()
            if g is not None and name in limits and name not in smp.saturated
        }
        if not per_s:
            return  # nothing judged this poll (first poll, resets, counters not served)
        bad = {name: r for name, r in sorted(per_s.items()) if r > limits[name]}
        self._judge(
            RAIL_ERRORS,
            self.errors,
            bool(bad),
            lambda: (
                f"{describe_port(smp)}: "
                + ", ".join(
                    f"{n} rising {r:.3g}/s (threshold {limits[n]:g}/s)" for n, r in bad.items()
                )
            ),
            now=now,
            at=at,
        )

    def _judge_flaps(self, now: float, at: datetime, port: str) -> None:
        horizon = now - self.s.flap_window_s
        while self.flaps and self.flaps[0][0] < horizon:
            self.flap_count -= self.flaps.popleft()[1]
        code = RAIL_FLAPPING.code
        if self.flap_count >= self.s.flap_threshold:
            if code not in self.raised:
                message = (
                    f"{port} went down {self.flap_count} times within {self.s.flap_window_s:.0f} s"
                )
                self.raised[code] = self._condition(RAIL_FLAPPING, message, at)
        else:
            self.raised.pop(code, None)

    def _judge(
        self,
        verdict: Verdict,
        hysteresis: Hysteresis,
        bad: bool,
        describe: Callable[[], str],
        *,
        now: float,
        at: datetime,
    ) -> None:
        if not hysteresis.update(bad, now):
            return
        if hysteresis.active:
            self.raised[verdict.code] = self._condition(verdict, describe(), at)
        else:
            self.raised.pop(verdict.code, None)

    def _condition(self, verdict: Verdict, message: str, at: datetime) -> Condition:
        return Condition(
            reason=verdict.reason,
            code=verdict.code,
            severity=self.severity[verdict.code],
            action=verdict.action,
            message=message[:MAX_MESSAGE],
            since=at,
            scope=RAIL_SCOPE,
        )

    def expire(self, now: float, at: datetime) -> bool:
        """Clean windows passed, flaps aged out; True when a verdict cleared."""
        before = len(self.raised)
        for verdict, hysteresis in (
            (RAIL_DOWN, self.down),
            (RAIL_DEGRADED_RATE, self.rate),
            (RAIL_ERRORS, self.errors),
        ):
            if hysteresis.expire(now):
                self.raised.pop(verdict.code, None)
        if self.sample is not None:
            self._judge_flaps(now, at, describe_port(self.sample))
        return len(self.raised) != before

    def clear(self) -> bool:
        """An operator cleared a GPU behind the port: every verdict goes, and the hysteresis
        and the flap window start over (a fault still present is raised again)."""
        changed = bool(self.raised)
        self.raised.clear()
        for hysteresis in (self.down, self.rate, self.errors):
            hysteresis.reset()
        self.flaps.clear()
        self.flap_count = 0
        self.carry = 0
        return changed

    def wire_key(self) -> tuple[object, ...]:
        """What the stream's Snapshot says of the port (a change is worth a new one): never the
        counters, which move all the time."""
        p = self.sample
        if p is None:
            return ()
        return (
            p.link_layer, p.port_state, p.phys_state, p.rate_gbps, p.netdev, p.model, p.gpus,
            p.affinity, self.expected, self.flap_count, tuple(sorted(self.raised)),
        )  # fmt: skip


class RailBook:
    """Every InfiniBand and RoCE port of the node and its tracker."""

    def __init__(self, settings: RailSettings) -> None:
        self.settings = settings
        self._ports: dict[PortKey, RailTracker] = {}
        self._owner: dict[PortKey, SourceName] = {}
        self._keys: dict[PortKey, tuple[object, ...]] = {}
        self.version = 0
        """Grows whenever what a Snapshot says of the ports changes."""

    def apply(self, obs: NicObservation, now: float) -> int:
        """One poll of every port of ``obs.source``; a port of that source neither in it nor
        on an unread device is gone (its verdicts with it). The number of counters that went
        backwards (reset, never read as growth)."""
        expected = expected_rates(obs.ports, self.settings)
        seen: set[PortKey] = set()
        resets = 0
        for smp in obs.ports:
            key = (smp.device, smp.port)
            if key in seen:
                continue
            seen.add(key)
            tracker = self._ports.get(key)
            if tracker is None:
                tracker = self._ports[key] = RailTracker(self.settings)
            self._owner[key] = obs.source
            resets += tracker.update(smp, expected.get(key), now, obs.at)
        removed = [
            key
            for key, source in self._owner.items()
            if source == obs.source and key not in seen and key[0] not in obs.unread
        ]
        for key in removed:
            del self._ports[key], self._owner[key]
        self._note_keys()
        return resets

    def expire(self, now: float, at: datetime) -> bool:
        """Time-based clearing (engine ticks); True when a verdict cleared."""
        changed = False
        for tracker in self._ports.values():
            changed |= tracker.expire(now, at)
        if changed:
            self._note_keys()
        return changed

    def clear(self, gpu: PciAddress) -> bool:
        """An operator clear of the GPU at ``gpu``: every port behind which it sits starts
        over; True when a verdict went."""
        changed = False
        for tracker in self._ports.values():
            if tracker.sample is not None and gpu in tracker.sample.gpus:
                changed |= tracker.clear()
        if changed:
            self._note_keys()
        return changed

    def _note_keys(self) -> None:
        keys = {key: t.wire_key() for key, t in self._ports.items()}
        if keys != self._keys:
            self._keys = keys
            self.version += 1

    def gpu_conditions(self) -> dict[PciAddress, dict[str, Condition]]:
        """The rail conditions each GPU carries: per code one condition, naming every port
        behind which the GPU sits that has the verdict (the earliest ``since``)."""
        found: dict[PciAddress, dict[str, list[Condition]]] = {}
        for _, tracker in sorted(self._ports.items()):
            smp = tracker.sample
            if smp is None or not tracker.raised:
                continue
            for gpu in smp.gpus:
                codes = found.setdefault(gpu, {})
                for code, cond in tracker.raised.items():
                    codes.setdefault(code, []).append(cond)
        return {
            gpu: {code: _merged(conds) for code, conds in codes.items()}
            for gpu, codes in found.items()
        }

    def statuses(self, gpu: Callable[[PciAddress], RailGpu | None]) -> list[RailStatus]:
        """Every port by device and number; ``gpu`` names a GPU address (None: not known)."""
        out = []
        for _, t in sorted(self._ports.items()):
            if t.sample is None:
                continue
            gpus = tuple(g for a in t.sample.gpus if (g := gpu(a)) is not None)
            out.append(
                RailStatus(
                    sample=t.sample,
                    expected_rate_gbps=t.expected,
                    flaps=t.flap_count,
                    flaps_total=t.flaps_total,
                    last_flap=t.last_flap,
                    verdicts=tuple(t.raised[c] for c in sorted(t.raised)),
                    gpus=tuple(sorted(gpus)),
                )
            )
        return out


def _merged(conds: list[Condition]) -> Condition:
    first = conds[0]
    if len(conds) == 1:
        return first
    return msgspec.structs.replace(
        first,
        message="; ".join(c.message for c in conds)[:MAX_MESSAGE],
        since=min((c.since for c in conds if c.since is not None), default=None),
    )
