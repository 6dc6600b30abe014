"""Transitions fanned out to listeners (inline) and subscribers (bounded queues)."""

from __future__ import annotations

import asyncio

from gpuhealth.agent.health.transition import Transition
from gpuhealth.agent.transition_fanout import TransitionFanout
from tests.support.agent import AT, XID79, uuid


def _t(i: int, current: str = "unhealthy") -> Transition:
    return Transition(
        kind="transition",
        uuid=uuid(i),
        index=i,
        previous="healthy",
        current=current,  # type: ignore[arg-type]
        conditions=(XID79,),
        at=AT,
        xid=79,
    )


async def test_hub_fans_out_to_listeners_and_subscribers() -> None:
    hub = TransitionFanout()
    seen: list[Transition] = []
    hub.add_listener(seen.append)

    def broken(_: Transition) -> None:
        raise RuntimeError("consumer bug")

    hub.add_listener(broken)
    sub = hub.subscribe(maxsize=2)
    hub.publish([_t(0), _t(1), _t(2)])
    assert [t.index for t in seen] == [0, 1, 2]
    assert sub.overflowed  # the oldest was dropped
    assert (await sub.get()).index == 1
    assert sub.get_nowait().index == 2  # type: ignore[union-attr]
    assert sub.get_nowait() is None
    sub.close()
    hub.publish([_t(3)])
    assert sub.pending() == 0 and hub.subscribers == 0


async def test_subscription_async_iteration() -> None:
    hub = TransitionFanout()
    sub = hub.subscribe()
    got: list[int] = []

    async def consume() -> None:
        async for t in sub:
            got.append(t.index)
            if len(got) == 2:
                return

    task = asyncio.create_task(consume())
    await asyncio.sleep(0)
    hub.publish([_t(4), _t(5)])
    await asyncio.wait_for(task, 1)
    assert got == [4, 5]
