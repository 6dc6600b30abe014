"""Admission pacing: the pure decision, the come-back delays, and the FIFO on a fake clock."""

from __future__ import annotations

import asyncio
import random

import pytest

from gpuhealth.controller.stream.admission import (
    AGENT_JITTER_ALLOWANCE,
    EXPECTED_AGENT_JITTER,
    PEAK_MEMORY_S,
    STORM_HORIZON_FACTOR,
    STORM_HORIZON_MIN_S,
    THROUGHPUT_WINDOW,
    Admission,
    Arrival,
    ComeBacks,
    Defer,
    Limits,
    at_door,
    decide,
    defer_for,
    storm_horizon,
)
from tests.support.clock import FakeClock, settle

L = Limits(max_concurrent=2, max_waiting=3, retry_after_min_s=1.0, retry_after_max_s=60.0)


@pytest.mark.parametrize(
    ("in_flight", "waiting", "draining", "expected"),
    [
        (0, 0, False, "admit"),
        (1, 0, False, "admit"),
        (2, 0, False, "wait"),  # every slot busy: wait for a turn
        (1, 1, False, "wait"),  # a free slot, but others came first (FIFO)
        (2, 2, False, "wait"),
        (2, 3, False, "queue_full"),  # beyond the bounded queue: come back later, at once
        (0, 0, True, "draining"),  # shutting down: nobody is admitted
        (2, 3, True, "draining"),
    ],
)
def test_decide(in_flight: int, waiting: int, draining: bool, expected: str) -> None:
    assert decide(in_flight=in_flight, waiting=waiting, draining=draining, limits=L) == expected


@pytest.mark.parametrize(
    ("in_flight", "waiting", "arriving", "draining", "expected"),
    [
        (0, 0, 0, False, "enter"),
        (2, 2, 0, False, "enter"),  # one place left in the queue
        (0, 0, 4, False, "enter"),  # four let in, Hellos not read yet: one place left
        (0, 0, 5, False, "queue_full"),  # a storm faster than Hellos: turned away at the door
        (2, 1, 2, False, "queue_full"),  # every place taken, whichever stage it is at
        (2, 3, 0, False, "queue_full"),
        (0, 0, 0, True, "draining"),
    ],
)
def test_at_door(
    in_flight: int, waiting: int, arriving: int, draining: bool, expected: str
) -> None:
    got = at_door(
        in_flight=in_flight, waiting=waiting, arriving=arriving, draining=draining, limits=L
    )
    assert got == expected


async def test_the_door_books_come_backs_after_those_let_in() -> None:
    clock = FakeClock()
    adm = Admission(L, clock, max_wait_s=10.0, initial_handshake_s=0.5)  # 4 handshakes/s
    let_in = [adm.door() for _ in range(5)]
    assert all(isinstance(a, Arrival) for a in let_in) and adm.arriving == 5
    first, second = adm.door(), adm.door()
    assert isinstance(first, Defer) and first.reason == "queue_full"
    assert isinstance(second, Defer) and second.retry_after_s > first.retry_after_s
    # 5 ahead at 4/s, told a quarter less for the agent's jitter
    assert first.retry_after_s == pytest.approx(telling(5 / 4))
    let_in[0].close()
    let_in[0].close()  # closing twice gives back one place
    assert adm.arriving == 4
    assert isinstance(adm.door(), Arrival)
    assert adm.arriving == 5


@pytest.mark.parametrize(
    ("backlog", "away", "rate", "next_turn", "retry", "following"),
    [
        # 100 ahead at 50/s: 2 s; the next deferral's turn is one slot (1/50 s) later
        (100, 0, 50.0, 0.0, 2.0, 102.02),
        # earlier deferrals booked until t=105, and 250 of them still away: after them
        (100, 250, 50.0, 105.0, 5.0, 105.02),
        # booked until t=105 when the rate was measured low, 50 still away: at 50/s they and
        # the backlog take 3 s, so this one is not put behind t=105
        (100, 50, 50.0, 105.0, 3.0, 103.02),
        # a short backlog is still at least retry_after_min_s
        (1, 0, 50.0, 0.0, 1.0, 101.02),
        # a huge backlog is capped at retry_after_max_s
        (100_000, 0, 50.0, 0.0, 60.0, 160.02),
        # a rate measured as zero does not divide by zero (capped)
        (10, 0, 0.0, 0.0, 60.0, 1160.0),
    ],
)
def test_defer_for_spreads_returns_at_the_admission_rate(
    backlog: int, away: int, rate: float, next_turn: float, retry: float, following: float
) -> None:
    got_retry, got_next = defer_for(
        100.0,
        backlog=backlog,
        away=away,
        rate_per_s=rate,
        next_turn=next_turn,
        horizon_s=1000.0,
        limits=L,
    )
    assert got_retry == pytest.approx(retry)
    assert got_next == pytest.approx(following)


def test_come_backs_are_booked_no_further_than_the_horizon() -> None:
    retry, following = defer_for(
        100.0, backlog=500, away=0, rate_per_s=10.0, next_turn=0.0, horizon_s=12.0, limits=L
    )
    assert retry == pytest.approx(12.0)  # not 50 s: a rate measured briefly is not trusted
    assert following == pytest.approx(112.1)
    assert storm_horizon(0.0) == STORM_HORIZON_MIN_S
    assert storm_horizon(100.0) == STORM_HORIZON_FACTOR * 100.0


def told(d: Defer | object) -> float:
    assert isinstance(d, Defer)
    return d.retry_after_s


def telling(wait_s: float) -> float:
    """What an agent whose turn is ``wait_s`` away is told: a quarter less (its jitter adds that
    back on average), at least ``retry_after_min_s``."""
    return max(L.retry_after_min_s, max(L.retry_after_min_s, wait_s) / (1 + EXPECTED_AGENT_JITTER))


def storm(rate_per_s: float) -> tuple[FakeClock, Admission]:
    """Every place at the door taken (5), handshakes assumed to run at ``rate_per_s``."""
    clock = FakeClock()
    adm = Admission(L, clock, max_wait_s=10.0, initial_handshake_s=L.max_concurrent / rate_per_s)
    for _ in range(5):
        assert isinstance(adm.door(), Arrival)
    return clock, adm


async def test_successive_deferrals_are_booked_behind_every_agent_still_away() -> None:
    clock, adm = storm(10.0)
    retries = [told(adm.door(f"node-{i}")) for i in range(20)]
    # 5 let in, then 0, 1, 2 ... agents told before, at 10/s
    assert retries == pytest.approx([telling((5 + i) / 10) for i in range(20)])
    assert adm.come_backs.away(clock.monotonic()) == 20
    # node-0 .. node-9 come back (turned away again): none is counted ahead of itself
    again = [told(adm.door(f"node-{i}")) for i in range(10)]
    assert again == pytest.approx([telling((5 + 19) / 10)] * 10)
    assert adm.come_backs.away(clock.monotonic()) == 20


async def test_an_agent_that_never_comes_back_is_forgotten_after_the_latest_it_was_expected() -> (
    None
):
    clock, adm = storm(10.0)
    first = told(adm.door("node-a"))
    assert adm.come_backs.away(clock.monotonic()) == 1
    clock.advance(first * (1 + AGENT_JITTER_ALLOWANCE) - 0.01)
    assert adm.come_backs.away(clock.monotonic()) == 1
    clock.advance(0.02)
    assert adm.come_backs.away(clock.monotonic()) == 0


async def test_agents_without_a_name_are_counted_apart() -> None:
    clock, adm = storm(10.0)
    for _ in range(3):
        adm.door()
    adm.door("node-a")
    adm.come_backs.back(None)  # nothing to match
    assert adm.come_backs.away(clock.monotonic()) == 4


async def test_a_rate_measured_low_for_a_while_puts_off_only_those_deferred_then() -> None:
    _clock, adm = storm(10.0)
    adm._mean_handshake_s = 2.0  # the loop swamped: 1 handshake/s, long delays told
    slow = [told(adm.door(f"slow-{i}")) for i in range(8)]
    assert max(slow) == pytest.approx(telling(12.0))
    adm._mean_handshake_s = 0.02  # back to 100/s: the next agent is not put behind their turns
    fast = told(adm.door("fast"))
    assert fast == pytest.approx(telling((5 + 8) / 100))
    assert fast < max(slow)


async def test_agents_away_are_bounded() -> None:
    clock, adm = storm(10.0)
    adm.come_backs = ComeBacks(max_entries=50)
    for i in range(60):
        adm.door(f"node-{i}")
    assert adm.come_backs.away(clock.monotonic()) == 50


async def test_draining_books_no_come_back() -> None:
    clock, adm = storm(10.0)
    adm.drain()
    assert told(adm.door("node-a")) == L.retry_after_min_s
    assert adm.come_backs.away(clock.monotonic()) == 0


def admission(clock: FakeClock, limits: Limits = L) -> Admission:
    return Admission(limits, clock, max_wait_s=10.0, initial_handshake_s=0.1)


async def test_turns_are_handed_over_in_order_and_the_queue_is_bounded() -> None:
    clock = FakeClock()
    a = admission(clock)
    assert await a.enter() == "admit"
    assert await a.enter() == "admit"
    waiters = [asyncio.create_task(a.enter()) for _ in range(3)]
    await settle()
    assert a.waiting == 3 and a.in_flight == 2
    over = await a.enter()  # the fourth waiter is answered at once, without waiting
    assert isinstance(over, Defer) and over.reason == "queue_full"
    # 5 ahead at 2 / 0.1 s = 20/s: 0.25 s, raised to the minimum
    assert over.retry_after_s == pytest.approx(1.0)
    a.leave(0.1)
    await settle()
    assert waiters[0].done() and waiters[0].result() == "admit"
    assert not waiters[1].done()
    assert a.in_flight == 2 and a.waiting == 2
    a.leave(0.1)
    a.leave(0.1)
    await settle()
    assert [w.result() for w in waiters] == ["admit", "admit", "admit"]
    assert a.in_flight == 2 and a.waiting == 0  # every freed slot was handed on


async def test_a_waiter_is_told_to_come_back_when_its_wait_expires() -> None:
    clock = FakeClock()
    a = admission(clock, Limits(1, 5, 1.0, 60.0))
    assert await a.enter() == "admit"
    waiter = asyncio.create_task(a.enter())
    await settle()
    await clock.advance_and_settle(9.9)
    assert not waiter.done()
    await clock.advance_and_settle(0.2)
    result = waiter.result()
    assert isinstance(result, Defer) and result.reason == "wait_expired"
    assert a.waiting == 0 and a.in_flight == 1
    assert a.busy_until >= clock.monotonic() + result.retry_after_s


async def test_the_admission_rate_is_measured_from_handshakes() -> None:
    clock = FakeClock()
    a = admission(clock, Limits(4, 0, 1.0, 600.0))
    assert a.rate_per_s() == pytest.approx(40.0)  # 4 / 0.1 s, assumed
    for _ in range(60):
        assert await a.enter() == "admit"
        a.leave(1.0)  # handshakes take 1 s (a slow API server)
    assert a.rate_per_s() == pytest.approx(4.0, rel=0.01)
    for _ in range(4):
        assert await a.enter() == "admit"
    first = await a.enter()
    second = await a.enter()
    assert isinstance(first, Defer) and isinstance(second, Defer)
    # 4 ahead at 4/s: the turn is 1 s away, told a quarter less (the agent's mean jitter),
    # raised to the minimum; the next slot is 1.25 s away: told 1 s
    assert first.retry_after_s == pytest.approx(1.0, rel=0.01)
    assert second.retry_after_s == pytest.approx(1.25 / (1 + EXPECTED_AGENT_JITTER), rel=0.01)
    third = await a.enter()
    assert isinstance(third, Defer)
    assert third.retry_after_s == pytest.approx(1.5 / (1 + EXPECTED_AGENT_JITTER), rel=0.01)


async def test_the_admission_rate_is_the_throughput_when_that_is_higher() -> None:
    """Handshakes that each take long while many complete per second (the slots were busy
    back to back): come-back delays follow what is admitted, not concurrency / latency."""
    clock = FakeClock()
    a = admission(clock, Limits(1, 1, 1.0, 600.0))
    assert await a.enter() == "admit"
    for _ in range(300):  # one slot, always someone waiting: back to back
        waiter = asyncio.create_task(a.enter())
        await settle()
        await clock.advance_and_settle(0.01)
        a.leave(2.0)
        await settle()
        assert waiter.result() == "admit"
    assert a.rate_per_s() == pytest.approx(100.0, rel=0.01)  # not 1 / 2 s
    # a slowdown: handshakes now 1 s apart; the best rate is remembered for PEAK_MEMORY_S
    for _ in range(THROUGHPUT_WINDOW):
        waiter = asyncio.create_task(a.enter())
        await settle()
        await clock.advance_and_settle(1.0)
        a.leave(1.0)
        await settle()
    assert clock.monotonic() > PEAK_MEMORY_S
    assert a.rate_per_s() == pytest.approx(1.0, rel=0.1)  # the peak forgotten: about 1/s


async def test_handshakes_completed_with_nobody_waiting_measure_arrivals_not_capacity() -> None:
    clock = FakeClock()
    a = admission(clock, Limits(4, 0, 1.0, 600.0))
    for _ in range(300):  # one agent every 0.5 s, each handshake 0.1 s: capacity is 40/s
        assert await a.enter() == "admit"
        await clock.advance_and_settle(0.5)
        a.leave(0.1)
    assert a.rate_per_s() == pytest.approx(40.0, rel=0.01)  # not 2/s


async def test_too_few_or_too_close_handshakes_say_nothing_of_the_throughput() -> None:
    clock = FakeClock()
    a = admission(clock, Limits(4, 0, 1.0, 600.0))
    for _ in range(10):  # fewer than THROUGHPUT_MIN, however fast
        assert await a.enter() == "admit"
        await clock.advance_and_settle(0.001)
        a.leave(1.0)
    assert a.rate_per_s() == pytest.approx(4 / a._mean_handshake_s)


async def test_drain_answers_every_waiter_and_refuses_newcomers() -> None:
    clock = FakeClock()
    a = admission(clock)
    await a.enter()
    await a.enter()
    waiters = [asyncio.create_task(a.enter()) for _ in range(3)]
    await settle()
    a.drain()
    await settle()
    for w in waiters:
        r = w.result()
        assert isinstance(r, Defer) and r.reason == "draining" and r.retry_after_s == 1.0
    late = await a.enter()
    assert isinstance(late, Defer) and late.reason == "draining"
    assert a.waiting == 0


async def test_a_cancelled_waiter_handed_a_turn_passes_it_on() -> None:
    """A handshake cancelled (its handler torn down) just as it got a turn does not leak the
    slot: the next waiter gets it."""
    clock = FakeClock()
    a = admission(clock, Limits(1, 5, 1.0, 60.0))
    await a.enter()
    first = asyncio.create_task(a.enter())
    second = asyncio.create_task(a.enter())
    await settle()
    a.leave(0.1)  # the turn goes to `first` ...
    first.cancel()  # ... which is cancelled before it runs
    await settle()
    assert first.cancelled()
    assert second.result() == "admit"
    assert a.in_flight == 1


async def simulated_storm(*, slow_for_s: float, slow_by: float) -> tuple[float, int]:
    """Every agent at once (a failover): 1,200 agents, a controller that completes 60
    handshakes per second (16 at once) once it is past the first ``slow_for_s`` seconds (each
    handshake ``slow_by`` times longer until then: the loop busy with the storm's first
    connections), a FIFO of 100; agents come back when told, plus up to half again (the
    agent's jitter). (when the last was admitted, tries in all)."""
    n, capacity, concurrent = 1200, 60.0, 16
    rng = random.Random(7)
    clock = FakeClock()
    a = Admission(Limits(concurrent, 100, 1.0, 120.0), clock, max_wait_s=20.0,
                  initial_handshake_s=0.05)  # fmt: skip
    t0 = clock.monotonic()
    done: list[float] = []
    tries = 0

    async def agent(node: str) -> None:
        nonlocal tries
        await clock.sleep(rng.uniform(0, 1.0))
        while True:
            tries += 1
            async with a.turn(node=node) as told:
                if told is None:
                    slow = slow_by if clock.monotonic() - t0 < slow_for_s else 1.0
                    await clock.sleep(slow * concurrent / capacity)
                    done.append(clock.monotonic() - t0)
                    return
            await clock.sleep(told.retry_after_s * rng.uniform(1.0, 1.5))

    tasks = [asyncio.create_task(agent(f"node-{i}")) for i in range(n)]
    while len(done) < n and clock.monotonic() - t0 < 300:
        clock.advance(0.05)
        for _ in range(3):
            await asyncio.sleep(0)
    for t in tasks:
        t.cancel()
    assert len(done) == n
    return max(done), tries


async def test_a_cold_start_storm_is_admitted_near_capacity() -> None:
    """All are admitted within 1.25x the time capacity allows (20 s), with no more than 3 tries
    each on average."""
    last, tries = await simulated_storm(slow_for_s=0.0, slow_by=1.0)
    assert last <= 1.25 * 1200 / 60
    assert tries <= 3 * 1200


async def test_a_storm_whose_first_seconds_are_slow_is_not_put_off_by_them() -> None:
    """Handshakes 10x slower for the first 5 s (6/s): the agents deferred then are not booked
    minutes out at that rate (the storm's horizon), and those deferred later are booked at the
    rate measured then, not behind them: all are in within 60 s (149 s without the horizon)."""
    last, tries = await simulated_storm(slow_for_s=5.0, slow_by=10.0)
    assert last <= 60.0
    assert tries <= 4 * 1200


async def test_a_storm_lasts_while_agents_wait_or_are_due_back() -> None:
    """``storm()`` (full collections wait meanwhile, controller/heap.py): from the first agent
    that waits or is told to come back until the last one told is due back."""
    clock = FakeClock()
    adm = admission(clock)
    assert not adm.storm()
    assert await adm.enter() == "admit" and await adm.enter() == "admit"
    assert adm.storm()  # every slot busy: the next one would wait
    adm.leave(0.1)
    adm.leave(0.1)
    assert not adm.storm()  # quiet again: nobody waited or was told anything
    let_in = [adm.door() for _ in range(5)]  # the room: 2 handshakes + 3 waiting
    assert all(isinstance(a, Arrival) for a in let_in)
    assert not adm.storm()  # arriving, not waiting yet
    told = adm.door()
    assert isinstance(told, Defer)
    for a in let_in:
        assert isinstance(a, Arrival)
        a.close()
    assert adm.storm()  # one agent told to come back is not due yet
    clock.advance(told.retry_after_s - 0.01)
    assert adm.storm()
    clock.advance(0.02)
    assert not adm.storm()
