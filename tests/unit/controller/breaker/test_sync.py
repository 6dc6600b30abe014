"""The breaker's state follows the leader: loaded (retried with backoff, nothing written
before) before any leader work, adopted without loosening the breaker, written on change,
closed when an operator edits the stored state; the stored window holds the whole budget. An
in-memory store stands in for the ConfigMap, a fake clock for time."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime, timedelta
from pathlib import Path

from prometheus_client import CollectorRegistry

from gpuhealth.controller.breaker.gate import CircuitBreaker, GateVerdict
from gpuhealth.controller.breaker.settings import BreakerSettings
from gpuhealth.controller.breaker.store import (
    CONFIGMAP_MAX_BYTES,
    ENTRY_MAX_BYTES,
    MAX_OPEN_POOLS,
    MAX_WINDOW,
    NODE_NAME_MAX,
    OTHER_DATA_BYTES,
    POOL_NAME_MAX,
    POOLS_MAX_BYTES,
    TIME_MAX,
    OpenPool,
    StoredBreaker,
    WindowEntry,
    configmap_data,
)
from gpuhealth.controller.breaker.sync import BreakerSync, stored_state
from gpuhealth.controller.kube.node_cache import NodeCache
from gpuhealth.controller.kube.rest import KubeError, PermanentKubeError, TransientKubeError
from gpuhealth.controller.leadership.work import build_leader_work
from tests.support.clock import FakeClock

SRC = Path(__file__).resolve().parents[4] / "src" / "gpuhealth"


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


def test_the_budget_is_capped_at_what_the_stored_window_holds() -> None:
    """max_fraction 1.0 of a fleet of 10 x MAX_WINDOW: the breaker admits MAX_WINDOW nodes in
    a window, then opens; everything it admitted is stored (no cut below the budget)."""
    clock = FakeClock()
    b = CircuitBreaker(BreakerSettings(max_fraction=1.0, min_nodes=1), clock)
    assert b.limit(10 * MAX_WINDOW) == MAX_WINDOW and b.limit(100) == 100
    for i in range(MAX_WINDOW):
        assert b.request(f"n{i}", 10 * MAX_WINDOW) is GateVerdict.ALLOW
    assert b.request("one-more", 10 * MAX_WINDOW) is GateVerdict.TRIP
    state = stored_state(b)
    assert len(state.window) == MAX_WINDOW and state.window[-1].node == f"n{MAX_WINDOW - 1}"


def test_the_largest_window_fits_a_configmap_whatever_the_node_names() -> None:
    """MAX_WINDOW entries with 253-character node names, 63-character pools and the longest
    timestamps, and MAX_OPEN_POOLS open pools of the longest names, encoded as the store
    writes them, stay within the API server's 1 MiB (keys and values); one entry more would
    not leave the room reserved for the other keys and the open pools."""
    at = "2026-11-22T10:00:00.123456+00:00"
    assert len(at) == TIME_MAX
    longest = [
        WindowEntry(node=f"{i:06d}" + "n" * (NODE_NAME_MAX - 6), at=at, pool="p" * POOL_NAME_MAX)
        for i in range(MAX_WINDOW)
    ]
    pools = tuple(
        OpenPool(pool=f"{i:03d}" + "p" * (POOL_NAME_MAX - 3), tripped_at=at, trips=2**63)
        for i in range(MAX_OPEN_POOLS)
    )
    state = StoredBreaker(
        open=True, trips=10**9, tripped_at=at, message="m" * 80, window=tuple(longest), pools=pools
    )
    data = configmap_data(state)
    size = sum(len(k.encode()) + len(v.encode()) for k, v in data.items())
    assert size <= CONFIGMAP_MAX_BYTES
    assert len(data["pools"].encode()) <= POOLS_MAX_BYTES
    window = len(data["window"].encode())
    assert window + ENTRY_MAX_BYTES > CONFIGMAP_MAX_BYTES - OTHER_DATA_BYTES - POOLS_MAX_BYTES


def test_a_union_past_the_budget_keeps_the_newest_entries() -> None:
    clock = FakeClock()
    b = CircuitBreaker(BreakerSettings(max_fraction=1.0), clock)
    old = clock.now() - timedelta(seconds=100)
    b.restore_window((f"old{i}", old) for i in range(10))
    b.restore_window((f"new{i}", clock.now()) for i in range(MAX_WINDOW))
    state = stored_state(b)
    assert len(state.window) == MAX_WINDOW
    assert {e.node for e in state.window} == {f"new{i}" for i in range(MAX_WINDOW)}


# -- the load before any leader work -------------------------------------------------------


class RefusingStore(MemoryStore):
    """The ConfigMap as a successor's first reads meet it: each of ``errors`` in turn, then
    the stored state."""

    def __init__(self, state: StoredBreaker | None, errors: list[KubeError]) -> None:
        super().__init__(state)
        self.errors = errors
        self.loads = 0

    async def load(self) -> StoredBreaker | None:
        self.loads += 1
        if self.errors:
            raise self.errors.pop(0)
        return await super().load()


REFUSALS = [
    PermanentKubeError("GET configmaps/gpuhealth-breaker: HTTP 403: forbidden", 403),
    TransientKubeError("GET configmaps/gpuhealth-breaker: HTTP 500: internal error", 500),
    TransientKubeError("GET configmaps/gpuhealth-breaker: timed out", 0),
]
OPEN_STORED = StoredBreaker(
    open=True,
    trips=2,
    tripped_at="2026-11-22T09:59:00+00:00",
    window=(WindowEntry("held-a", "2026-11-22T09:58:00+00:00"),),
)


def _errors(sync: BreakerSync) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(sync.metrics.load_errors)
    return {
        s.labels["status"]: s.value
        for m in registry.collect()
        for s in m.samples
        if s.name.endswith("_total")
    }


async def test_a_failed_load_is_retried_with_backoff_and_nothing_is_written_before() -> None:
    """403, 500, a timeout, then the stored open breaker: each failure counted and waited
    out (1 s, 2 s, 4 s with breaker.load_backoff_*), nothing written to the store meanwhile
    (not even a change made here while waiting), and the open breaker adopted at the end."""
    b, clock = make()
    b.settings = BreakerSettings(
        max_fraction=0.0, min_nodes=1, sync_interval_s=1.0, load_backoff_s=1.0
    )
    store = RefusingStore(OPEN_STORED, list(REFUSALS))
    sync = BreakerSync(b, store, Owner(b), clock, rand=lambda: 0.5)
    task = asyncio.create_task(sync.run())  # run() loads first when prepare did not
    await clock.settle()
    assert store.loads == 1 and not sync.loaded
    b.request("here", 100)  # admitted in memory while loading: a change to write later
    for delay, loads in ((1.0, 2), (2.0, 3), (4.0, 4)):
        await clock.advance_and_settle(delay - 0.01)
        assert store.loads == loads - 1 and store.saves == 0  # waiting out the backoff
        await clock.advance_and_settle(0.01)
        assert store.loads == loads
    assert sync.loaded and b.is_open and b.trips == 2
    assert {n for n, _ in b.window()} == {"held-a", "here"}
    assert _errors(sync) == {"403": 1.0, "500": 1.0, "none": 1.0}
    assert store.saves == 0
    await clock.advance_and_settle(1.0)  # now it writes: the union, still open
    assert store.saves == 1 and store.state is not None and store.state.open
    assert {e.node for e in store.state.window} == {"held-a", "here"}
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert not sync.loaded  # the next term reads the store again


async def test_a_404_is_a_successful_load_of_nothing_stored() -> None:
    """No ConfigMap yet: loaded at once, nothing adopted; a breaker opened here is written."""
    b, clock = make()
    store = MemoryStore(None)
    sync = BreakerSync(b, store, Owner(b), clock)
    await sync.adopt()
    assert sync.loaded and not b.is_open and _errors(sync) == {}
    b.request("a", 10)
    assert b.request("b", 10) is GateVerdict.TRIP
    task = asyncio.create_task(sync.run())
    await clock.settle()
    await clock.advance_and_settle(1.0)
    assert store.state is not None and store.state.open
    task.cancel()


async def test_a_takeover_never_closes_an_open_breaker_nor_shortens_its_window() -> None:
    """This replica's breaker (from an earlier term) is open and holds a and b; the store
    says closed, with b admitted later and c. After the load: still open, the window is the
    union, b counted from its later admission."""
    clock = FakeClock()
    s = BreakerSettings(max_fraction=0.0, min_nodes=2, window_s=600.0)
    b = CircuitBreaker(s, clock)
    assert b.request("a", 100) is GateVerdict.ALLOW
    assert b.request("b", 100) is GateVerdict.ALLOW
    assert b.request("x", 100) is GateVerdict.TRIP
    later = (clock.now() + timedelta(seconds=300)).isoformat()
    store = MemoryStore(
        StoredBreaker(
            open=False, window=(WindowEntry("b", later), WindowEntry("c", clock.now().isoformat()))
        )
    )
    await clock.advance_and_settle(300.0)
    await BreakerSync(b, store, Owner(b), clock).adopt()
    assert b.is_open
    window = dict(b.window())
    assert set(window) == {"a", "b", "c"} and window["b"] == datetime.fromisoformat(later)
    await clock.advance_and_settle(350.0)  # a (650 s) and c expired; b (350 s) still counts
    assert [n for n, _ in b.window()] == ["b"]


async def test_leader_work_is_not_ready_and_starts_nothing_until_the_breaker_is_loaded() -> None:
    """LeaderWork's prepare waits for the load: meanwhile ``ready`` (leader readiness,
    /readyz, the gate) is false and no leader task has started."""
    b, clock = make()
    b.settings = BreakerSettings(load_backoff_s=1.0, load_backoff_max_s=1.0)
    store = RefusingStore(OPEN_STORED, [REFUSALS[0]] * 5)
    sync = BreakerSync(b, store, Owner(b), clock, rand=lambda: 0.5)
    cache = NodeCache(api=None, clock=clock)  # type: ignore[arg-type]
    cache.informer.synced.set()
    started: list[str] = []

    class Reconciler:
        async def run(self) -> None:
            started.append("reconciler")
            await asyncio.Event().wait()

    work = build_leader_work(
        cache=cache,
        reconciler=Reconciler(),  # type: ignore[arg-type]
        breaker_state=sync,
        dra=None,
        endpoints=(),
        remediation=None,
        dry_run=False,
    )
    task = asyncio.create_task(work.run())
    await clock.settle()
    for _ in range(4):
        assert not work.ready and started == [] and store.saves == 0
        await clock.advance_and_settle(1.0)
    assert store.loads == 5 and not work.ready and started == []
    await clock.advance_and_settle(1.0)
    assert store.loads == 6 and work.ready and started == ["reconciler"] and b.is_open
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert not work.ready


def test_the_documented_largest_budget_is_the_computed_one() -> None:
    """The settings' docs (and so docs/settings.md) name the cap by its number."""
    settings = (SRC / "controller" / "breaker" / "settings.py").read_text(encoding="utf-8")
    assert settings.count(f"at most {MAX_WINDOW:,}") == 2
    store = (SRC / "controller" / "breaker" / "store.py").read_text(encoding="utf-8")
    assert f"({MAX_WINDOW:,})" in store
