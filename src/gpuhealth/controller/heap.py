"""CPython's cyclic garbage collector in the process that holds the fleet.

The controller keeps every Node, agent pod and agent connection for its life: millions of
long-lived objects at 20,000 nodes. With CPython's defaults a young collection runs every 700
allocations, so the objects of requests still in flight are promoted to the old generations,
and a full collection, which walks every object and holds the event loop meanwhile, runs
whenever the old generation grew by a quarter. While 5,000 agents connected that was a
quarter to a third of the controller's CPU (28 full collections in 210 s, 15.6 s of 64 s of
CPU, pauses up to 0.84 s: bench ``fleet_scale``, measured with ``gc.callbacks``); with the
two changes below, 3 full collections and 3.6 s of 37 s, and every agent connected in 46 s
instead of 111-157 s:

- a larger young generation (``gc_young_threshold``): most objects of a request die before
  they are collected, so far fewer reach the old generation;
- once the first LIST of Nodes and agent pods is in, everything then alive (modules,
  settings, the caches) is frozen (``gc.freeze``, ``gc_freeze_at_start``): no full collection
  walks it again. Frozen objects are still freed by reference counting when the caches drop
  them; only reference cycles among them would wait for a process restart, and the caches
  hold none.

- during an admission storm (agents waiting for a turn or told to come back), full
  collections wait (:func:`hold_full_collections`, at most ``gc_full_wait_max_s`` in a row):
  the storm itself creates the objects that trigger them, a full collection of 19,000 agents'
  objects took 1-1.7 s of CPU, and one such pause 20 s into every 19,000-agent storm, with the
  API server on the same cores answering the storm's TokenReviews, held the Lease renewal past
  its deadline (bench ``fleet_scale``). Young collections go on; the one held back runs when
  the storm is over, with the API server quiet.

What is left is measured: every collection's duration by generation
(``gpuhealth_controller_gc_seconds``, :func:`time_collections`), so that an event loop found
late (``gpuhealth_controller_event_loop_lag_seconds``) can be told apart from a collection.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Sequence
from typing import Any

from gpuhealth.common.clock import Clock
from gpuhealth.common.logging import get_logger

log = get_logger("heap")


def tune_collector(young_threshold: int) -> None:
    """The young generation's threshold; the older two keep CPython's ratios."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(young_threshold, older, oldest)


async def freeze_when_synced(synced: Sequence[asyncio.Event]) -> None:
    """After every cache's first LIST: collect once, then freeze what is alive."""
    for event in synced:
        await event.wait()
    collected = gc.collect()
    gc.freeze()
    log.info("heap_frozen", objects=gc.get_freeze_count(), collected=collected)


def time_collections(observe: Callable[[int, float], None]) -> Callable[[], None]:
    """``observe(generation, seconds)`` after every collection of this process; returns the
    function that stops it."""
    began = 0.0

    def callback(phase: str, info: dict[str, Any]) -> None:
        nonlocal began
        if phase == "start":
            began = time.perf_counter()
        else:
            observe(int(info["generation"]), time.perf_counter() - began)

    gc.callbacks.append(callback)
    return lambda: gc.callbacks.remove(callback)


HELD_THRESHOLD = 1_000_000_000
"""CPython's full-collection threshold while full collections wait: never reached."""
HOLD_CHECK_S = 1.0
"""How often :func:`hold_full_collections` asks whether a storm goes on."""


def hold_full(storm: bool, held_for_s: float | None, max_s: float) -> bool:
    """Whether full collections wait now (pure): during a storm, at most ``max_s`` in a row
    (``held_for_s``: how long they have waited, None when they do not)."""
    return max_s > 0 and storm and (held_for_s is None or held_for_s < max_s)


async def hold_full_collections(storm: Callable[[], bool], clock: Clock, max_s: float) -> None:
    """Until cancelled: while ``storm()``, CPython's full collections wait (their threshold
    raised out of reach), at most ``max_s`` in a row; after that they are let run for one
    check (``HOLD_CHECK_S``) before waiting again. The threshold is restored on the way out."""
    since: float | None = None
    oldest = gc.get_threshold()[2]
    try:
        while True:
            now = clock.monotonic()
            if hold_full(storm(), None if since is None else now - since, max_s):
                if since is None:
                    since = now
                    _full_threshold(HELD_THRESHOLD)
            elif since is not None:
                since = None
                _full_threshold(oldest)
            await clock.sleep(HOLD_CHECK_S)
    finally:
        if since is not None:
            _full_threshold(oldest)


def _full_threshold(value: int) -> None:
    young, older, _ = gc.get_threshold()
    gc.set_threshold(young, older, value)
