"""Per-connection protocol state: decode, order check, dedupe, deliver, ack; and the answer.

:class:`Session` decides without I/O. :class:`Connection` is the server's record of one
accepted agent and the :class:`~gpuhealth.controller.stream.agent_socket.StreamHandler` of its
stream: each frame goes to the session where it is parsed, and the acknowledgement (or the
Error that ends the stream) is written straight to the connection (:class:`Answers`: the rules
every connection shares). The stream server, which admits connections and keeps the table of
them, is not on a frame's path.

Sequence rules (``gpuhealth.protocol.v1``): on one connection the sequence numbers after Hello must
be strictly increasing and not below ``Hello.seq`` (forward gaps are fine: the agent may have
dropped heartbeats); anything else is OUT_OF_ORDER. Across connections the controller keeps
the highest sequence number applied per (node, stream_id) in a :class:`SeqTracker`; a message
at or below it is a replayed duplicate: acknowledged, not delivered again.

Action reports (the remediation loop's, from the agent's outbox like every other message) follow
the same sequence rules and go to the report sink instead of the fleet.

Acks are cumulative. Events, Snapshots and action reports are acknowledged at once;
Heartbeats only every ``heartbeat_ack_every``-th in a row (the acknowledgement is what costs
the controller most per message: one socket send), which the agent's Ack watchdog must allow
for.

Also here: :class:`IngestSink`, the seam between the stream and fleet state (the fleet implements
it; calls happen on the event loop and must not block), and :class:`TokenBucket`, the
per-connection message rate limit (clock-driven, pure).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from aiohttp import WebSocketError, WSCloseCode, WSMsgType

from gpuhealth.common.clock import Clock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.stream.agent_socket import StreamSocket
from gpuhealth.controller.stream.metrics import StreamServerMetrics
from gpuhealth.protocol import (
    Ack,
    Error,
    ErrorCode,
    Event,
    Heartbeat,
    Hello,
    ProtocolError,
    Snapshot,
    encode,
)
from gpuhealth.protocol.codec import decode_agent
from gpuhealth.protocol.remediation import ActionReport

log = get_logger("controller.stream")

TEXT_REFUSED = "text frames are not accepted"

_TYPE_NAME: dict[type, str] = {
    Snapshot: "snapshot",
    Event: "event",
    Heartbeat: "heartbeat",
    ActionReport: "action-report",
}

ReportSink = Callable[[str, ActionReport], None]
"""Where an agent's remediation action reports go (the controller's ``ReportBook.record``)."""

SeqVerdict = Literal["deliver", "duplicate", "out_of_order"]


def check_seq(seq: int, last_on_connection: int, applied: int) -> SeqVerdict:
    """Classify one message's sequence number (pure)."""
    if seq <= last_on_connection:
        return "out_of_order"
    if seq <= applied:
        return "duplicate"
    return "deliver"


class SeqTracker:
    """Highest sequence number applied per node, for the node's current stream.

    It belongs with the fleet state, not with one server instance: a restarted stream server
    that shares the tracker still delivers every message exactly once. One entry per node
    (a new ``stream_id`` replaces the old one), so memory is bounded by the fleet size.
    """

    def __init__(self) -> None:
        self._applied: dict[str, tuple[str, int]] = {}

    def applied(self, node: str, stream_id: str) -> int:
        entry = self._applied.get(node)
        return entry[1] if entry is not None and entry[0] == stream_id else 0

    def record(self, node: str, stream_id: str, seq: int) -> None:
        self._applied[node] = (stream_id, seq)

    def __len__(self) -> int:
        return len(self._applied)


@dataclass(frozen=True, slots=True)
class Reply:
    """What to send back for one frame; ``error`` means send it and close."""

    ack: Ack | None = None
    error: Error | None = None


NO_REPLY = Reply()
"""Nothing to send (most Heartbeats: acknowledged by a later Ack); one shared instance."""


def error_reply(code: ErrorCode, message: str) -> Reply:
    return Reply(error=Error(code=code, message=message[:1024]))


class Session:
    """An authenticated connection's state after Hello."""

    def __init__(
        self,
        hello: Hello,
        sink: IngestSink,
        tracker: SeqTracker,
        metrics: StreamServerMetrics,
        bucket: TokenBucket,
        *,
        heartbeat_ack_every: int = 1,
        reports: ReportSink | None = None,
    ) -> None:
        self.node = hello.node
        self._reports = reports
        self.stream_id = hello.stream_id
        self.last = hello.seq - 1
        self.replaced = False
        self._sink = sink
        self._tracker = tracker
        self._metrics = metrics
        self._bucket = bucket
        self._ack_every = max(1, heartbeat_ack_every)
        self._unacked_heartbeats = 0

    def on_frame(self, data: bytes, now: float) -> Reply:
        if not self._bucket.take(now):
            return error_reply(ErrorCode.RATE_LIMITED, "message rate limit exceeded")
        try:
            msg = decode_agent(data)
        except ProtocolError as exc:
            return error_reply(ErrorCode(exc.code), str(exc))
        if isinstance(msg, Hello):
            return error_reply(ErrorCode.OUT_OF_ORDER, "Hello after Hello")
        return self.on_message(msg)

    def on_message(self, msg: Snapshot | Event | Heartbeat | ActionReport) -> Reply:
        if msg.node != self.node:
            return error_reply(
                ErrorCode.FORBIDDEN, f"message for node {msg.node!r} on {self.node!r}"
            )
        verdict = check_seq(msg.seq, self.last, self._tracker.applied(self.node, self.stream_id))
        if verdict == "out_of_order":
            return error_reply(
                ErrorCode.OUT_OF_ORDER, f"seq {msg.seq} after {self.last} on this connection"
            )
        if self.replaced:
            return NO_REPLY
        self.last = msg.seq
        self._metrics.messages[_TYPE_NAME[type(msg)]] += 1
        if verdict == "deliver":
            if isinstance(msg, ActionReport):
                # acknowledged even without a loop to take it: the agent must not block on it
                if self._reports is not None:
                    self._reports(self.node, msg)
            else:
                self._sink.on_message(self.node, msg)
            self._tracker.record(self.node, self.stream_id, msg.seq)
        if isinstance(msg, Heartbeat) and verdict == "deliver":
            self._unacked_heartbeats += 1
            if self._unacked_heartbeats < self._ack_every:
                return NO_REPLY  # acknowledged cumulatively by a later Ack
        self._unacked_heartbeats = 0
        return Reply(ack=Ack(seq=msg.seq))


class IngestSink(Protocol):
    def on_connect(self, node: str, hello: Hello) -> None:
        """An authenticated agent said Hello (a reconnect replaces the older connection)."""

    def on_message(self, node: str, msg: Snapshot | Event | Heartbeat) -> None:
        """A message not seen before, in sequence order for that node's stream."""

    def on_disconnect(self, node: str) -> None:
        """The node's live connection closed (not called when replaced by a newer one)."""


class TokenBucket:
    def __init__(self, rate_per_s: float, burst: float, now: float) -> None:
        self.rate = rate_per_s
        self.burst = burst
        self._tokens = burst
        self._at = now

    def take(self, now: float, n: float = 1.0) -> bool:
        """Spend ``n`` tokens if available at time ``now`` (monotonic seconds)."""
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= n:
            self._tokens -= n
            return True
        return False


@dataclass(slots=True)
class Answers:
    """What every connection's answers share: the clock of the rate limit, the counts, the
    bound on acknowledgements the agent leaves unread, and who is told a connection ended."""

    clock: Clock
    metrics: StreamServerMetrics
    unread_max_bytes: int
    release: Callable[[Connection], None]

    def frame_error(self, error: object) -> None:
        """A frame aiohttp's parser refused: counted (too large or malformed) and logged."""
        too_big = isinstance(error, WebSocketError) and error.code == WSCloseCode.MESSAGE_TOO_BIG
        code = ErrorCode.TOO_LARGE if too_big else ErrorCode.MALFORMED
        self.metrics.errors[code.value] += 1
        log.warning("stream_frame_error", code=str(code), error=str(error))


@dataclass(slots=True)
class Connection:
    """The server's record of one accepted agent, and its stream's handler."""

    ws: StreamSocket
    """aiohttp's :class:`~gpuhealth.controller.stream.agent_socket.AgentSocket` until the stream
    is handed over, then an :class:`~gpuhealth.controller.stream.agent_socket.AgentStream`."""
    session: Session
    answers: Answers
    pod_uid: str
    order_seq: int = 0
    """Orders sent on this connection (each order's ``seq``; the agent drops repeats)."""

    def on_message(self, mtype: WSMsgType, data: object) -> Error | None:
        """A frame of a handed-over stream as it is parsed: a binary frame applied and
        acknowledged here; the Error that refuses it (or a text frame), if any. A parser
        error is counted (the stream closes with its code)."""
        if mtype is WSMsgType.BINARY and isinstance(data, bytes):
            try:
                return self.apply(data)
            except Exception as exc:
                log.exception("stream_handler_failed", node=self.session.node, error=str(exc))
                self.answers.metrics.errors[ErrorCode.INTERNAL.value] += 1
                return Error(code=ErrorCode.INTERNAL, message="internal error")
        if mtype is WSMsgType.TEXT:
            self.answers.metrics.errors[ErrorCode.MALFORMED.value] += 1
            return Error(code=ErrorCode.MALFORMED, message=TEXT_REFUSED)
        self.answers.frame_error(data)
        return None

    def apply(self, data: bytes) -> Error | None:
        """One binary frame into the session; its acknowledgement written; the error that
        ends the stream, if any."""
        session, answers = self.session, self.answers
        reply = session.on_frame(data, answers.clock.monotonic())
        if reply.error is not None:
            answers.metrics.errors[reply.error.code.value] += 1
            log.warning("stream_frame_rejected", node=session.node, code=str(reply.error.code))
            return reply.error
        if reply.ack is not None:
            ws = self.ws
            if ws.unread > answers.unread_max_bytes:
                error = Error(code=ErrorCode.RATE_LIMITED, message="acknowledgements not read")
                answers.metrics.errors[error.code.value] += 1
                log.warning("stream_not_reading", node=session.node, unread=ws.unread)
                return error
            ws.write_binary(encode(reply.ack))
        return None

    def on_lost(self) -> None:
        self.answers.release(self)
