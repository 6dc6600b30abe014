"""How late the controller's event loop runs what is due.

Everything the controller does (agents' heartbeats, the Lease renewal, scheduler calls, API
requests) is a callback on one event loop; whatever holds the loop (a long turn, a full
garbage collection, a storm of connections) delays all of it alike. A task sleeps
``loop_lag_interval_s`` and records how much longer than that it took:
``gpuhealth_controller_event_loop_lag_seconds``. A lag near ``leader.renew_deadline_s`` is a
Lease about to be lost to load.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuhealth.common.clock import Clock


async def watch_loop_lag(clock: Clock, interval_s: float, observe: Callable[[float], None]) -> None:
    """Until cancelled: sleep ``interval_s``, ``observe`` the time overslept (seconds)."""
    while True:
        began = clock.monotonic()
        await clock.sleep(interval_s)
        observe(max(0.0, clock.monotonic() - began - interval_s))
