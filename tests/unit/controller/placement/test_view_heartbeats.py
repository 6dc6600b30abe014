"""The placement index recomputes a node's summary only when something it reads changed.

Frames go through the real per-connection session into the real fleet; the index follows the
fleet. After every frame the summary must equal one computed from scratch (``summarize``), and
a Heartbeat repeating the last figures must compute nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from gpuhealth.controller.fleet.model import Fleet
from gpuhealth.controller.placement.view import PlacementIndex, summarize
from gpuhealth.controller.stream.metrics import StreamServerMetrics
from gpuhealth.controller.stream.session import SeqTracker, Session, TokenBucket
from gpuhealth.protocol import Event, GpuTelemetry, Heartbeat, Snapshot, encode
from tests.support.clock import FakeClock
from tests.support.placement import alloc, gpu
from tests.support.protocol import XID79, heartbeat, hello, snapshot, transition

NODE = "n"
GPUS = [gpu(0, temp=50.0, sbe=0), gpu(1, temp=60.0, sbe=0)]


def tel(i: int, temp: float, sbe: int = 0) -> GpuTelemetry:
    return GpuTelemetry(
        uuid=f"GPU-{i}", temperature_c=temp, slowdown_temperature_c=90.0, sbe_recent=sbe
    )


SAME = [tel(0, 50.0), tel(1, 60.0)]


@dataclass
class Node:
    fleet: Fleet
    index: PlacementIndex
    session: Session
    seq: int = 1

    def send(self, make: Callable[[int], Heartbeat | Event | Snapshot], check: bool = True) -> None:
        self.seq += 1
        reply = self.session.on_frame(encode(make(self.seq)), 0.0)
        assert reply.error is None
        if not check:
            return
        rec = self.fleet.node(NODE)
        assert rec is not None
        want = summarize(NODE, rec.gpus.values(), rec.allocations, self.index.settings)
        assert self.index.summaries[NODE] == want  # never stale, whatever was skipped


def connected() -> Node:
    fleet = Fleet(clock=FakeClock())
    index = PlacementIndex(fleet)
    h = hello(NODE, [g.info for g in GPUS], seq=1)
    fleet.on_connect(NODE, h)
    session = Session(h, fleet, SeqTracker(), StreamServerMetrics(), TokenBucket(1e9, 1e9, 0.0))
    node = Node(fleet, index, session)
    node.send(lambda seq: snapshot(NODE, GPUS, allocations=[alloc(0)], seq=seq))
    node.send(lambda seq: heartbeat(NODE, telemetry=SAME, seq=seq))
    return node


def test_a_heartbeat_that_changes_nothing_computes_nothing() -> None:
    node = connected()
    computed, summary = node.index.computed, node.index.summaries[NODE]
    for _ in range(5):
        node.send(lambda seq: heartbeat(NODE, telemetry=SAME, seq=seq))
        node.send(lambda seq: heartbeat(NODE, seq=seq))  # no telemetry at all
    assert node.index.computed == computed
    assert node.index.summaries[NODE] is summary


@pytest.mark.parametrize(
    ("name", "frame", "recomputed", "kept"),
    [
        # telemetry within the same score: the score is checked, the summary stays
        (
            "warmer-same-score",
            lambda seq: heartbeat(NODE, telemetry=[tel(0, 51.0), tel(1, 60.0)], seq=seq),
            0,
            True,
        ),
        # telemetry that moves the score: a new score (and priority entry), the rest kept
        (
            "hot-gpu",
            lambda seq: heartbeat(NODE, telemetry=[tel(0, 89.0, 50), tel(1, 89.0, 50)], seq=seq),
            0,
            False,
        ),
        # a GPU's state changes: the whole summary again
        (
            "gpu-fault",
            lambda seq: transition(NODE, 1, "unhealthy", XID79, uuid="GPU-1", seq=seq),
            1,
            False,
        ),
        # a Snapshot (new allocations): the whole summary again
        (
            "snapshot",
            lambda seq: snapshot(NODE, GPUS, allocations=[alloc(0), alloc(1)], seq=seq),
            1,
            False,
        ),
    ],
)
def test_what_a_change_recomputes(
    name: str,
    frame: Callable[[int], Heartbeat | Event | Snapshot],
    recomputed: int,
    kept: bool,
) -> None:
    node = connected()
    computed, before = node.index.computed, node.index.summaries[NODE]
    node.send(frame)
    after = node.index.summaries[NODE]
    assert node.index.computed - computed == recomputed, name
    assert (after is before) == kept, name
    computed = node.index.computed
    node.send(lambda seq: heartbeat(NODE, seq=seq))  # and the next quiet Heartbeat: nothing
    assert node.index.computed == computed
    assert node.index.summaries[NODE] is after


def test_a_snapshot_with_new_telemetry_is_not_lost_by_the_next_heartbeat() -> None:
    node = connected()
    hot = [gpu(0, temp=89.0, sbe=50), gpu(1, temp=89.0, sbe=50)]
    # a Snapshot that changes only telemetry tells no listener (as before): the index
    # catches up at the next Heartbeat, which repeats that telemetry
    node.send(lambda seq: snapshot(NODE, hot, allocations=[alloc(0)], seq=seq), check=False)
    node.send(lambda seq: heartbeat(NODE, telemetry=[hot[0].telemetry], seq=seq))  # type: ignore[list-item]
    node.send(lambda seq: heartbeat(NODE, telemetry=SAME, seq=seq))  # cools down again
    assert node.index.summaries[NODE].score == connected().index.summaries[NODE].score
