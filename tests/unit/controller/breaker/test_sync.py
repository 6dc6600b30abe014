"""The breaker's state follows the leader: adopt on taking the lead, write on change, close
when an operator edits the stored state. An in-memory store stands in for the ConfigMap."""

from __future__ import annotations

import asyncio

from gpuhealth.controller.breaker.gate import CircuitBreaker, GateVerdict
from gpuhealth.controller.breaker.settings import BreakerSettings
from gpuhealth.controller.breaker.store import StoredBreaker
from gpuhealth.controller.breaker.sync import BreakerSync, stored_state
from tests.support.clock import FakeClock


class MemoryStore:
    def __init__(self, state: StoredBreaker | None = None) -> None:
        self.state = state
        self.saves = 0

    async def load(self) -> StoredBreaker | None:
        return self.state

    async def save(self, state: StoredBreaker) -> None:
        self.state = state
        self.saves += 1


class Owner:
    def __init__(self, b: CircuitBreaker) -> None:
        self.b = b
        self.resets = 0

    def reset(self, *, by: str) -> list[str]:
        assert by == "configmap"
        self.resets += 1
        return self.b.reset()


def make() -> tuple[CircuitBreaker, FakeClock]:
    clock = FakeClock()
    s = BreakerSettings(max_fraction=0.0, min_nodes=1, sync_interval_s=1.0, poll_interval_s=5.0)
    return CircuitBreaker(s, clock), clock


async def test_adopts_an_open_breaker() -> None:
    b, _ = make()
    store = MemoryStore(StoredBreaker(open=True, trips=3, tripped_at="2026-11-22T10:00:00+00:00"))
    await BreakerSync(b, store, Owner(b), FakeClock()).adopt()
    assert b.is_open and b.trips == 3 and b.tripped_at is not None
    assert b.request("n1", 100) is GateVerdict.BLOCK


async def test_closed_or_missing_state_changes_nothing() -> None:
    for store in (MemoryStore(), MemoryStore(StoredBreaker(open=False))):
        b, clock = make()
        await BreakerSync(b, store, Owner(b), clock).adopt()
        assert not b.is_open


async def test_writes_trips_and_reads_operator_close() -> None:
    b, clock = make()
    store = MemoryStore()
    owner = Owner(b)
    task = asyncio.create_task(BreakerSync(b, store, owner, clock).run())
    await clock.advance_and_settle(1.0)
    assert store.saves == 0
    b.request("a", 10)
    assert b.request("b", 10) is GateVerdict.TRIP
    await clock.advance_and_settle(1.0)
    assert store.state is not None and store.state.open and store.state.trips == 1
    store.state = StoredBreaker(open=False, trips=1)  # kubectl patch ... state: closed
    for _ in range(6):
        await clock.advance_and_settle(1.0)
    assert owner.resets == 1 and not b.is_open
    assert store.state is not None and not store.state.open
    task.cancel()


async def test_an_operator_close_right_after_a_failover_is_not_overwritten() -> None:
    """The new leader adopts an open breaker; the operator closes it in the ConfigMap before
    the first sync: the state just read is not written back over the operator's close."""
    b, clock = make()
    store = MemoryStore(StoredBreaker(open=True, trips=1))
    owner = Owner(b)
    state = BreakerSync(b, store, owner, clock)
    await state.adopt()
    assert b.is_open
    store.state = StoredBreaker(open=False, trips=1)  # kubectl patch ... state: closed
    task = asyncio.create_task(state.run())
    for _ in range(6):
        await clock.advance_and_settle(1.0)
    assert owner.resets == 1 and not b.is_open
    assert store.state is not None and not store.state.open
    task.cancel()


async def test_the_window_survives_a_restart_and_a_crash_loop_gets_no_fresh_budget() -> None:
    """min_nodes=2: the first leader admits two nodes and writes its window; a restarted
    controller (a new breaker) adopts it, so a third node trips it instead of being admitted.
    Entries older than the window are forgotten on adoption."""
    clock = FakeClock()
    s = BreakerSettings(max_fraction=0.0, min_nodes=2, window_s=600.0, sync_interval_s=1.0)
    store = MemoryStore()
    first = CircuitBreaker(s, clock)
    task = asyncio.create_task(BreakerSync(first, store, Owner(first), clock).run())
    assert first.request("a", 100) is GateVerdict.ALLOW
    await clock.advance_and_settle(100.0)
    assert first.request("b", 100) is GateVerdict.ALLOW
    await clock.advance_and_settle(1.0)
    task.cancel()
    assert store.state is not None and [e.node for e in store.state.window] == ["a", "b"]

    again = CircuitBreaker(s, clock)  # the process restarted: nothing in memory
    await BreakerSync(again, store, Owner(again), clock).adopt()
    assert again.request("a", 100) is GateVerdict.ALLOW  # already counted
    assert again.request("c", 100) is GateVerdict.TRIP

    await clock.advance_and_settle(550.0)  # "a" was admitted 651 s ago, "b" 551 s ago
    later = CircuitBreaker(s, clock)
    await BreakerSync(later, store, Owner(later), clock).adopt()
    assert [n for n, _ in later.window()] == ["b"]
    assert later.request("c", 100) is GateVerdict.ALLOW


async def test_the_stored_window_is_bounded() -> None:
    from gpuhealth.controller.breaker.store import MAX_WINDOW

    clock = FakeClock()
    b = CircuitBreaker(BreakerSettings(max_fraction=1.0, min_nodes=1), clock)
    for i in range(MAX_WINDOW + 10):
        assert b.request(f"n{i}", 10 * MAX_WINDOW) is GateVerdict.ALLOW
    state = stored_state(b)
    assert len(state.window) == MAX_WINDOW and state.window[-1].node == f"n{MAX_WINDOW + 9}"
