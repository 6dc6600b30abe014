"""Pure pieces of the agent's stream client: backoff, token file, heartbeat queueing, Event mapping
(the controller's stream pieces are tested under tests/unit/controller/stream/)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuhealth.agent.stream.backoff import Backoff, backoff_delay
from gpuhealth.agent.stream.settings import BackoffSettings
from gpuhealth.agent.stream.token import TokenFile
from gpuhealth.common.clock import FakeClock
from gpuhealth.common.errors import TransientError

S = BackoffSettings(initial_s=1.0, max_s=10.0, factor=2.0, jitter=0.5)


@pytest.mark.parametrize(
    ("attempt", "rand", "expected"),
    [
        (1, 0.5, 1.0),
        (2, 0.5, 2.0),
        (3, 0.5, 4.0),
        (5, 0.5, 10.0),
        (50, 0.5, 10.0),
        (1, 0.0, 0.5),
        (1, 0.999999, 1.5),
        (4, 0.0, 4.0),
    ],
)
def test_backoff_delay(attempt: int, rand: float, expected: float) -> None:
    assert backoff_delay(S, attempt, lambda: rand) == pytest.approx(expected, rel=1e-5)


def test_backoff_counts_and_resets() -> None:
    b = Backoff(S, lambda: 0.5)
    assert [b.next_delay() for _ in range(3)] == [1.0, 2.0, 4.0]
    b.reset()
    assert b.next_delay() == 1.0


def test_token_file_rereads_on_rotation(tmp_path: Path) -> None:
    p = tmp_path / "token"
    p.write_text("one\n")
    tf = TokenFile(p)
    assert tf.get() == "one"
    assert tf.get() == "one"
    assert tf.reads == 1
    tmp = tmp_path / "token.new"
    tmp.write_text("two-rotated")
    os.replace(tmp, p)  # the kubelet swaps atomically
    assert tf.get() == "two-rotated"
    assert tf.reads == 2
    p.write_text("")
    with pytest.raises(TransientError):
        tf.get()
    p.unlink()
    with pytest.raises(TransientError):
        tf.get()


async def test_heartbeats_queued_on_the_injected_clock(tmp_path: Path) -> None:
    import asyncio

    from gpuhealth.agent.stream.client import StreamClient
    from gpuhealth.agent.stream.outbox import Outbox
    from gpuhealth.agent.stream.settings import StreamClientSettings
    from gpuhealth.protocol import Heartbeat, decode
    from tests.support.stream import FakeAgentState

    clock = FakeClock()
    c = StreamClient(
        StreamClientSettings(heartbeat_interval_s=10.0),
        FakeAgentState("node-a"),
        Outbox(tmp_path),
        lambda: "t",
        clock=clock,
    )
    task = asyncio.create_task(c.run_heartbeats())
    try:
        await clock.advance_and_settle(0)  # let the task start sleeping
        await clock.advance_and_settle(9.9)
        assert len(c.outbox) == 0
        await clock.advance_and_settle(0.2)
        await clock.advance_and_settle(10.5)
        beats = [decode(e.frame) for e in c.outbox.entries()]
        assert [type(b) for b in beats] == [Heartbeat, Heartbeat]
        assert [b.seq for b in beats] == [1, 2]  # type: ignore[union-attr]
        assert beats[0].node == "node-a" and len(beats[0].telemetry) == 2  # type: ignore[union-attr]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        c.outbox.close()


def test_event_from_transition_maps_every_field() -> None:
    from gpuhealth.agent.stream.client import event_from_transition
    from tests.support.stream import transition

    t = transition(79, gpu=3)
    e = event_from_transition(12, "node-a", t)
    assert (e.seq, e.node, e.gpu_uuid, e.gpu_index, e.kind) == (
        12,
        "node-a",
        "GPU-3",
        3,
        "transition",
    )
    assert (e.previous, e.current, e.xid, e.at) == (t.previous, t.current, 79, t.at)


def test_a_message_the_controller_would_reject_is_never_queued(tmp_path: Path) -> None:
    import dataclasses

    from gpuhealth.agent.stream.client import StreamClient
    from gpuhealth.agent.stream.outbox import Outbox
    from gpuhealth.agent.stream.settings import StreamClientSettings
    from gpuhealth.protocol import Condition
    from tests.support.stream import FakeAgentState, transition

    c = StreamClient(StreamClientSettings(), FakeAgentState("node-a"), Outbox(tmp_path), str)
    bad = Condition(reason="XidError", code="not a label value!", severity="unhealthy")
    c.publish(dataclasses.replace(transition(1), conditions=(bad,)))
    c.publish(transition(2))
    assert c.metrics.dropped["invalid"] == 1
    from gpuhealth.protocol import decode

    queued = [decode(e.frame) for e in c.outbox.entries()]
    assert [(m.seq, m.xid) for m in queued] == [(1, 2)]  # type: ignore[union-attr]
    c.outbox.close()
