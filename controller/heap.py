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
