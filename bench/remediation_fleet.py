"""In-process agents for the remediation bench against the API server
(``bench/bench_remediation_kube.py``).

Each :class:`SimAgent` is one node's agent as the controller sees it: a connection in the
real :class:`~gpuhealth.controller.stream.server.StreamServer` whose WebSocket is an
in-memory pipe. Its messages are msgpack frames taken by the real stream ``Session`` (rate
bucket, sequence check, dedupe) into the fleet and the report book; the controller's orders
are written by the real ``StreamServer.send_order`` (encoded, ``seq`` counted) and decoded
here. The agent acts at once on the next loop turn: a reset makes the failed GPU healthy
(a transition Event) and reports ``succeeded``; a validation reports ``succeeded`` (the
soak is the controller's ``validation.soak_s``, 0 in the bench). No TokenReview, no socket:
those are measured by the stream benchmarks.
"""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime
from typing import Any, cast

from msgspec.structs import replace

from gpuhealth.controller.stream.server import StreamServer
from gpuhealth.controller.stream.session import Connection, Session, TokenBucket
from gpuhealth.protocol import (
    Allocation,
    Condition,
    Event,
    GpuInfo,
    GpuStatus,
    Heartbeat,
    Hello,
    Snapshot,
)
from gpuhealth.protocol.codec import decode_controller, encode
from gpuhealth.protocol.remediation import (
    ActionReport,
    CheckResult,
    ResetGpuOrder,
    ValidateOrder,
)
from gpuhealth.protocol.v1 import CAPABILITIES

GPUS = 8
HEARTBEAT_S = 10.0
"""The agent's default ``stream.heartbeat_interval_s`` (the fleet marks a node silent after
60 s without a message)."""
FAULTY_GPU = 1
XID48 = Condition(
    reason="XidError",
    code="xid-48",
    severity="unhealthy",
    action="RESET_GPU",
    xid=48,
    message="An uncorrectable double bit error",
)


def _now() -> datetime:
    return datetime.now(UTC)


class _Pipe:
    """The agent's end of the connection: what ``send_order`` writes lands here."""

    closed = False

    def __init__(self, agent: SimAgent) -> None:
        self._agent = agent

    async def send_bytes(self, data: bytes) -> None:
        self._agent.receive(data)


class SimAgent:
    def __init__(self, node: str, stream: StreamServer) -> None:
        self.node = node
        self.stream = stream
        self.infos = [GpuInfo(index=i, uuid=f"GPU-{node}-{i}") for i in range(GPUS)]
        self.seq = itertools.count(1)
        self.allocations: list[Allocation] = []
        self.done: dict[str, ActionReport] = {}
        """Order id -> its report (an order is executed at most once)."""
        self.validated = asyncio.Event()
        self.hello = Hello(
            seq=next(self.seq), node=node, stream_id="bench", boot_id="boot-1",
            agent_version="bench", gpus=self.infos, capabilities=list(CAPABILITIES),
        )  # fmt: skip
        settings = stream.settings
        self.session = Session(
            self.hello,
            stream.sink,
            stream.tracker,
            stream.metrics,
            TokenBucket(settings.rate_per_s, settings.rate_burst, 0.0),
            heartbeat_ack_every=settings.heartbeat_ack_every,
            # the server's report sink (the controller's ReportBook), as its own sessions get
            reports=stream._reports,
        )

    def connect(self) -> None:
        """What the server does after an accepted Hello, then the agent's first Snapshot."""
        self.stream.connections[self.node] = Connection(
            cast(Any, _Pipe(self)), self.session, self.stream.answers, pod_uid=""
        )
        self.stream.sink.on_connect(self.node, self.hello)
        self.snapshot()

    def heartbeat(self) -> None:
        self.send(Heartbeat(seq=next(self.seq), node=self.node, at=_now()))

    def send(self, msg: Snapshot | Event | Heartbeat | ActionReport) -> None:
        reply = self.session.on_frame(encode(msg), asyncio.get_running_loop().time())
        if reply.error is not None:
            raise RuntimeError(f"{self.node}: stream refused a frame: {reply.error}")

    def snapshot(self) -> None:
        self.send(
            Snapshot(
                seq=next(self.seq),
                node=self.node,
                taken_at=_now(),
                gpus=[GpuStatus(info=g, state="healthy") for g in self.infos],
                allocations=self.allocations,
            )
        )

    def hold(self, namespace: str, pod: str) -> None:
        """The kubelet's PodResources now show ``pod`` on the GPU that will fail."""
        uuid = self.infos[FAULTY_GPU].uuid
        self.allocations = [
            Allocation(namespace=namespace, pod=pod, container="main", gpu_uuid=uuid,
                       device_id=uuid)
        ]  # fmt: skip
        self.snapshot()

    def fault(self) -> datetime:
        """A double-bit ECC error (XID 48, RESET_GPU) on GPU 1; returns its time."""
        at = _now()
        self.validated.clear()
        self._transition(at, "healthy", "unhealthy", [replace(XID48, since=at)])
        return at

    def _transition(self, at: datetime, old: str, new: str, conds: list[Condition]) -> None:
        g = self.infos[FAULTY_GPU]
        self.send(
            Event(
                seq=next(self.seq), node=self.node, at=at, kind="transition",
                gpu_uuid=g.uuid, gpu_index=g.index, previous=old, current=new,  # type: ignore[arg-type]
                conditions=conds, xid=conds[0].xid if conds else None,
            )
        )  # fmt: skip

    def receive(self, data: bytes) -> None:
        order = decode_controller(data)
        asyncio.get_running_loop().call_soon(self._act, order)

    def _act(self, order: object) -> None:
        if not isinstance(order, ResetGpuOrder | ValidateOrder):
            return
        report = self.done.get(order.order_id)
        if report is None:
            checks: list[CheckResult] = []
            if isinstance(order, ResetGpuOrder):
                self.allocations = []  # the pod was drained; the reset cleared the fault
                self._transition(_now(), "unhealthy", "healthy", [])
            else:
                checks = [CheckResult(name="nvml", passed=True),
                          CheckResult(name="soak", passed=True)]  # fmt: skip
            report = ActionReport(
                seq=1, node=self.node, order_id=order.order_id, episode=order.episode,
                action="reset-gpu" if isinstance(order, ResetGpuOrder) else "validate",
                state="succeeded", at=_now(), boot_id=self.hello.boot_id, checks=checks,
            )  # fmt: skip
            self.done[order.order_id] = report
        # a repeated order gets the same result again (a new outbox entry, a new seq)
        self.send(replace(report, seq=next(self.seq)))
        if isinstance(order, ValidateOrder):
            self.validated.set()


async def heartbeats(agents: list[SimAgent]) -> None:
    """Every agent's heartbeat, every ``HEARTBEAT_S``, spread over the interval."""
    gap = HEARTBEAT_S / max(1, len(agents))
    while True:
        for a in agents:
            a.heartbeat()
            await asyncio.sleep(gap)
