"""The controller's stop sequence, bounded as a whole: it must end inside the Pod's grace
period (``terminationGracePeriodSeconds``), or the kubelet kills it mid-step (the Lease not
given up, the agents' streams cut without a going-away close).

:func:`stop_in_order` runs the steps one after the other (agents first, then the parts and the
Lease, then the listener and the API client, see ``controller/cli.py``), each step's own
bounds as before; past ``deadline_s`` from the first step the step running is cancelled, the
rest except the ``always`` ones are skipped, and the outcome says which.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from gpuhealth.common.clock import Clock, SystemClock

Step = tuple[str, Callable[[], Awaitable[object]]]


@dataclass
class Stopped:
    took_s: float = 0.0
    steps: dict[str, float] = field(default_factory=dict)
    """Seconds each step that ran took."""
    cut: str | None = None
    """The step the deadline cancelled, if any."""
    skipped: list[str] = field(default_factory=list)


async def stop_in_order(
    steps: Sequence[Step],
    deadline_s: float,
    *,
    always: Sequence[Step] = (),
    clock: Clock | None = None,
) -> Stopped:
    """Run ``steps`` in order within ``deadline_s`` in all, then ``always`` (closing what
    must be closed; each is quick) whatever happened."""
    clock = clock or SystemClock()
    out = Stopped()
    began = clock.monotonic()
    pending = list(steps)
    try:
        async with clock.timeout(deadline_s):
            while pending:
                name, run = pending[0]
                t = clock.monotonic()
                try:
                    await run()
                finally:
                    out.steps[name] = round(clock.monotonic() - t, 3)
                pending.pop(0)
    except TimeoutError:
        out.cut = pending[0][0]
        out.skipped = [name for name, _ in pending[1:]]
    for name, run in always:
        t = clock.monotonic()
        await run()
        out.steps[name] = round(clock.monotonic() - t, 3)
    out.took_s = round(clock.monotonic() - began, 3)
    return out
