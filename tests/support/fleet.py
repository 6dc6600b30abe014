"""Drive the controller's fleet through its IngestSink, as the stream server would."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from gpuhealth.controller.stream.session import IngestSink
from gpuhealth.protocol import Condition, HealthState
from tests.support.protocol import T0, hello, snapshot, transition


def connect(
    sink: IngestSink,
    node: str,
    gpus: int = 2,
    *,
    state: HealthState = "healthy",
    faults: Mapping[int, Condition] | None = None,
    at: datetime = T0,
) -> None:
    """An agent on ``node`` says Hello and sends its first Snapshot (``GPU-<node>-<i>``)."""
    sink.on_connect(node, hello(node, gpus))
    sink.on_message(node, snapshot(node, gpus, state=state, faults=faults, at=at))


def send_transition(
    sink: IngestSink, node: str, index: int, state: HealthState, *conditions: Condition
) -> None:
    """GPU ``index`` of ``node`` changes to ``state``."""
    sink.on_message(node, transition(node, index, state, *conditions))
