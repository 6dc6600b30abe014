"""Admission pacing: how many agent handshakes (token review, pod check, accept) run at once,
how many wait for a turn, and when an agent told to come back should return.

After a restart or a failover every agent connects at once. The controller, not the agents'
timers, paces that storm: at most ``admission_max_concurrent`` handshakes are admitted at a
time, at most ``admission_max_waiting`` more wait in a FIFO (their sockets held open, nothing
read from them) for at most ``admission_max_wait_s``, and everyone beyond is told to come back
after N s. Most of a storm is turned away at the door (:func:`at_door`), before the WebSocket
upgrade, with HTTP 503 and ``Retry-After``: one short answer instead of an upgrade, a Hello and
a close handshake per come-back. A Hello whose wait expired is answered
``Error(rate-limited, retry_after_s=N)``. Each deferral books the next slot at the measured
admission rate, no later than the agents ahead (in the handshakes, the queue, let in, and told
to come back and not back yet) take at that rate, and no further ahead than the storm's age
allows (:func:`defer_for`), so the agents told to come back arrive about as fast as they can
be admitted. The agent's Ack
deadline starts only with the controller's first Ack (when it is served), so waiting for a
turn never times out a stream.

:func:`at_door`, :func:`decide` and :func:`defer_for` are pure; :class:`Admission` keeps the
counts, the FIFO and the come-backs booked.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal

from gpuhealth.common.clock import Clock

AdmitNow = Literal["admit"]
WaitTurn = Literal["wait"]


@dataclass(frozen=True, slots=True)
class Defer:
    """Answer now: come back after ``retry_after_s``."""

    retry_after_s: float
    reason: str
    """``queue_full``, ``wait_expired``, ``draining`` or ``not_owner`` (another replica owns
    the node's shard; the ``reason`` label of ``gpuhealth_stream_deferred_total``)."""


@dataclass(frozen=True, slots=True)
class Limits:
    max_concurrent: int
    max_waiting: int
    retry_after_min_s: float
    retry_after_max_s: float


def decide(
    *, in_flight: int, waiting: int, draining: bool, limits: Limits
) -> AdmitNow | WaitTurn | str:
    """Admit now, wait for a turn, or (a string: the reason) answer come-back-later."""
    if draining:
        return "draining"
    if in_flight < limits.max_concurrent and waiting == 0:
        return "admit"
    if waiting < limits.max_waiting:
        return "wait"
    return "queue_full"


def at_door(*, in_flight: int, waiting: int, arriving: int, draining: bool, limits: Limits) -> str:
    """Before the WebSocket upgrade: ``"enter"``, or (the reason) answer come-back-later at
    once with HTTP 503. Every connection let in but whose Hello has not reached the queue
    yet (``arriving``) counts against the room, so a storm that arrives faster than Hellos
    are read is turned away here, where a refusal costs one short HTTP answer, instead of
    after an upgrade, a Hello and a close handshake each."""
    if draining:
        return "draining"
    if in_flight + waiting + arriving < limits.max_concurrent + limits.max_waiting:
        return "enter"
    return "queue_full"


def defer_for(
    now: float,
    *,
    backlog: int,
    away: int,
    rate_per_s: float,
    next_turn: float,
    horizon_s: float,
    limits: Limits,
) -> tuple[float, float]:
    """(retry_after_s, the next agent's earliest turn) for an agent deferred at ``now``.

    Its turn comes after the ``backlog`` (handshakes in flight and waiting, connections let in)
    is admitted at ``rate_per_s``, and after every agent deferred before it (``next_turn``):
    each deferral books the next 1/rate slot, so returns are spread at the rate admissions can
    take them. But never later than the ``away`` agents told to come back and not back yet,
    added to the backlog, take at the rate measured now: a rate measured low for a while (a
    storm's first seconds, the door itself keeping the event loop busy) pushed the bookings far
    out, and without this bound every later agent would be put behind them while the
    controller sits idle. Nor later than ``horizon_s`` (:func:`storm_horizon`): a rate measured
    for a few seconds says little about the next minutes. Clamped to ``[retry_after_min_s,
    retry_after_max_s]``."""
    rate = max(rate_per_s, 1e-3)
    booked = min(next_turn, now + (backlog + away) / rate)
    turn = min(max(now + backlog / rate, booked), now + horizon_s)
    retry = min(limits.retry_after_max_s, max(limits.retry_after_min_s, turn - now))
    return retry, max(booked, now + retry) + 1.0 / rate


STORM_HORIZON_MIN_S = 15.0
STORM_HORIZON_FACTOR = 4.0
"""How far ahead a come-back may be booked: ``STORM_HORIZON_FACTOR`` times how long the storm
has lasted, at least ``STORM_HORIZON_MIN_S``. In a storm's first seconds the event loop is busy
with the storm's own connections and the admission rate measured then is far below what the
controller does a minute later: at 19,000 agents at once, bookings at that rate told agents to
come back after up to 240 s while the controller sat idle (bench ``fleet_scale``). Bounded
so, an agent deferred early comes back soon and is booked again at the rate measured by then;
a come-back turned away at the door costs one short answer. In a simulation of 1,200 agents at
60 handshakes/s (``test_admission``), 10x slower for the first 5 s: all admitted in 48 s
instead of 149 s; without the slow start: 22.6 s either way (the lowest minimum that keeps it
so)."""


def storm_horizon(storm_age_s: float) -> float:
    """How far ahead a come-back may be booked ``storm_age_s`` into a storm."""
    return max(STORM_HORIZON_MIN_S, STORM_HORIZON_FACTOR * storm_age_s)


BOOKED_MAX = 100_000
"""Agents away remembered: a fleet's worth. Beyond it the count stops growing (a door hammered
by one client books no more memory)."""


class ComeBacks:
    """The agents told to come back and not back yet, each remembered by its node's name (a
    claim: the ``Gpuhealth-Node`` header or Hello's ``node``, kept as a hash) until it is back
    or past the latest it was expected. Counted so that a deferral is booked behind every agent
    still away, and an agent that comes back early is not counted ahead of itself."""

    def __init__(self, max_entries: int = BOOKED_MAX) -> None:
        self._max = max_entries
        self._latest: dict[int, float] = {}
        self._expiry: list[tuple[float, int]] = []
        self._anonymous = 0

    def back(self, node: str | None) -> None:
        if node:
            self._latest.pop(hash(node), None)

    def book(self, node: str | None, latest: float) -> None:
        if len(self._latest) >= self._max:
            return
        if node:
            key = hash(node)
        else:  # no name given: counted, never matched
            self._anonymous -= 1
            key = self._anonymous
        self._latest[key] = latest
        heapq.heappush(self._expiry, (latest, key))

    def away(self, now: float) -> int:
        """Agents still away at ``now``."""
        expiry, latest = self._expiry, self._latest
        while expiry and expiry[0][0] <= now:
            at, key = heapq.heappop(expiry)
            if latest.get(key) == at:
                del latest[key]
        if len(expiry) > 2 * len(latest) + 1024:  # entries of agents back since: rebuild
            self._expiry = [(at, key) for key, at in latest.items()]
            heapq.heapify(self._expiry)
        return len(latest)


THROUGHPUT_WINDOW = 256
"""Handshakes whose completion times measure the admission throughput."""
THROUGHPUT_MIN = 16
THROUGHPUT_MIN_SPAN_S = 1.0
"""The throughput is trusted once that many handshakes completed over at least this long."""
PEAK_MEMORY_S = 60.0
"""How long the best throughput measured is remembered: a storm's returns are spread at what
the controller showed it can do, not at a passing slowdown's pace."""

EXPECTED_AGENT_JITTER = 0.25
"""What an agent adds on average to a come-back delay: half of its default
``stream.backoff.retry_after_jitter`` (0.5). Delays are told that much shorter, so that the
agents return at the admission rate rather than a quarter slower (measured in a simulation of
19,000 agents at 150 handshakes/s: 165 s to admit all of them without it, against 127 s at
best)."""

AGENT_JITTER_ALLOWANCE = 1.0
"""An agent told to come back after N s is expected back within N x (1 + this): the agent's
``stream.backoff.retry_after_jitter`` (0.5 by default) with room to spare."""


class Admission:
    """The FIFO of handshakes and its counts. ``enter`` returns ``"admit"`` (the caller holds a
    slot and must call :meth:`leave`) or a :class:`Defer`."""

    def __init__(
        self, limits: Limits, clock: Clock, *, max_wait_s: float, initial_handshake_s: float
    ) -> None:
        self.limits = limits
        self._clock = clock
        self._max_wait = max_wait_s
        self._in_flight = 0
        self._waiters: deque[asyncio.Future[AdmitNow | Defer]] = deque()
        self._next_turn = 0.0
        self._storm_began = 0.0
        self.come_backs = ComeBacks()
        self._mean_handshake_s = initial_handshake_s
        self._completed: deque[float] = deque(maxlen=THROUGHPUT_WINDOW)
        """Completion times of handshakes that ended while others waited (the controller
        admitting as fast as it can: throughput then is capacity, not the arrival rate)."""
        self._peak = (0.0, 0.0)
        """(best throughput, when it was measured)."""
        self._arriving = 0
        self.draining = False
        self.busy_until = 0.0
        """Monotonic time until which agents were told to wait or come back (plus their
        retry-after): the controller, not the agent, is why such an agent is quiet."""

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def arriving(self) -> int:
        return self._arriving

    def door(self, node: str | None = None) -> Arrival | Defer:
        """:func:`at_door` for a new connection (``node``: whose agent it says it is): an
        :class:`Arrival` (it counts as arriving until it enters :meth:`turn` or is closed) or
        the :class:`Defer` to answer now."""
        self.come_backs.back(node)
        d = at_door(
            in_flight=self._in_flight,
            waiting=len(self._waiters),
            arriving=self._arriving,
            draining=self.draining,
            limits=self.limits,
        )
        if d != "enter":
            return self._defer(d, node)
        return Arrival(self)

    @property
    def busy(self) -> bool:
        """A new handshake would wait or be told to come back."""
        return self.draining or bool(self._waiters) or self._in_flight >= self.limits.max_concurrent

    def storm(self) -> bool:
        """A storm goes on: a handshake would wait, or agents told to wait or to come back are
        not all due back yet (``busy_until``)."""
        return self.busy or self._clock.monotonic() < self.busy_until

    @contextlib.asynccontextmanager
    async def turn(
        self, arrival: Arrival | None = None, node: str | None = None
    ) -> AsyncIterator[Defer | None]:
        """:meth:`enter` (the ``arrival`` let in at the door no longer arriving), then yields
        None within the turn (left on exit, its time measured) or the :class:`Defer` the agent
        is to be told."""
        if arrival is not None:
            arrival.close()
        entered = await self.enter(node)
        if isinstance(entered, Defer):
            yield entered
            return
        started = self._clock.monotonic()
        try:
            yield None
        finally:
            self.leave(self._clock.monotonic() - started)

    def rate_per_s(self) -> float:
        """Handshakes the controller completes per second: the throughput of the last
        handshakes completed while others waited (capacity, every delay included), or the best
        such throughput of the last ``PEAK_MEMORY_S`` if higher (too early a return costs the
        agent one more come-back; too late leaves the controller idle while agents wait).
        Until that is measured: the concurrency over the mean handshake time, which leaves out
        how long a woken waiter takes to run on a busy event loop (at 5,000 agents at once it
        told ~4x the rate admitted, and the agents came back to a full queue, again and
        again).
        """
        peak, at = self._peak
        if self._clock.monotonic() - at > PEAK_MEMORY_S:
            peak = 0.0
        shown = max(self._throughput(), peak)
        if shown > 0:
            return shown
        return self.limits.max_concurrent / max(self._mean_handshake_s, 1e-3)

    def _throughput(self) -> float:
        done = self._completed
        if len(done) < THROUGHPUT_MIN:
            return 0.0
        span = done[-1] - done[0]
        return (len(done) - 1) / span if span >= THROUGHPUT_MIN_SPAN_S else 0.0

    def _defer(self, reason: str, node: str | None) -> Defer:
        now = self._clock.monotonic()
        if reason == "draining":  # another replica serves it: come back soon
            retry = self.limits.retry_after_min_s
            self.busy_until = max(self.busy_until, now + retry)
            return Defer(retry, reason)
        self._storm_goes_on(now)
        turn, self._next_turn = defer_for(
            now,
            backlog=self._in_flight + len(self._waiters) + self._arriving,
            away=self.come_backs.away(now),
            rate_per_s=self.rate_per_s(),
            next_turn=self._next_turn,
            horizon_s=storm_horizon(now - self._storm_began),
            limits=self.limits,
        )
        # The agent comes back after N s plus up to half of it again (its retry_after_jitter):
        # told a quarter less, it arrives at its booked turn on average.
        retry = max(self.limits.retry_after_min_s, turn / (1.0 + EXPECTED_AGENT_JITTER))
        self.come_backs.book(node, now + retry * (1.0 + AGENT_JITTER_ALLOWANCE))
        self.busy_until = max(self.busy_until, now + retry)
        return Defer(retry, reason)

    def _storm_goes_on(self, now: float) -> None:
        """An agent waits or is deferred at ``now``: a storm begins if none was on."""
        if now >= self.busy_until:
            self._storm_began = now

    async def enter(self, node: str | None = None) -> AdmitNow | Defer:
        self.come_backs.back(node)
        d = decide(
            in_flight=self._in_flight,
            waiting=len(self._waiters),
            draining=self.draining,
            limits=self.limits,
        )
        if d == "admit":
            self._in_flight += 1
            return "admit"
        if d != "wait":
            return self._defer(d, node)
        now = self._clock.monotonic()
        self._storm_goes_on(now)
        self.busy_until = max(self.busy_until, now + self._max_wait)
        fut: asyncio.Future[AdmitNow | Defer] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        timer = asyncio.ensure_future(self._clock.sleep(self._max_wait))
        try:
            await asyncio.wait((fut, timer), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            if fut.done() and fut.result() == "admit":
                self._release()  # the turn handed over is not used: pass it on
            fut.cancel()
            raise
        finally:
            timer.cancel()
            with contextlib.suppress(ValueError):
                self._waiters.remove(fut)
        if fut.done():
            return fut.result()
        fut.cancel()
        return self._defer("wait_expired", node)

    def leave(self, handshake_s: float) -> None:
        """A slot is free (the handshake took ``handshake_s``): hand it to the next waiter."""
        self._mean_handshake_s += 0.1 * (handshake_s - self._mean_handshake_s)
        if self._waiters:
            now = self._clock.monotonic()
            self._completed.append(now)
            current = self._throughput()
            if current >= self._peak[0] or now - self._peak[1] > PEAK_MEMORY_S:
                self._peak = (current, now)
        self._release()

    def _release(self) -> None:
        self._in_flight -= 1
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                self._in_flight += 1
                fut.set_result("admit")
                return

    def drain(self) -> None:
        """Shutting down: every waiter and every later arrival is told to come back soon."""
        self.draining = True
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(self._defer("draining", None))


class Arrival:
    """A connection let in at the door whose Hello has not entered the queue yet; counted in
    :attr:`Admission.arriving` until :meth:`close` (idempotent)."""

    __slots__ = ("_admission",)

    def __init__(self, admission: Admission) -> None:
        admission._arriving += 1
        self._admission: Admission | None = admission

    def close(self) -> None:
        if self._admission is not None:
            self._admission._arriving -= 1
            self._admission = None
