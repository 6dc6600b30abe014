"""The durable, bounded outbox: unacknowledged agent messages, replayed in order.

The messages live in the agent's state store (:mod:`gpuhealth.agent.state_store`, table
``outbox``: ``seq``, ``kind``, the encoded protocol frame) and in memory, in sequence order.
A message is an event, a heartbeat, a snapshot or a remediation action report; an Ack deletes
everything ``<= seq``; the bound policy deletes heartbeats (never events); the highest sequence
number ever assigned is kept, so a sequence number is never reused. An append commits with
whatever else the caller writes in the same transaction (the engine driver's: an XID's Event,
its latched verdict and the kernel-log position past its line together).
"""

from __future__ import annotations

import bisect
import fcntl
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuhealth.agent.state_store import Kind, StateStore
from gpuhealth.agent.stream.metrics import StreamMetrics
from gpuhealth.agent.stream.settings import OutboxSettings
from gpuhealth.common.errors import ConfigError
from gpuhealth.common.logging import get_logger
from gpuhealth.protocol import MAX_FRAME_BYTES, Event, Heartbeat, ProtocolError, Snapshot, encode
from gpuhealth.protocol.codec import decode_agent
from gpuhealth.protocol.remediation import ActionReport

__all__ = ["Kind", "Outbox", "OutboxEntry", "OutboxMessage"]

log = get_logger("agent.outbox")
LOCK_NAME = "outbox.lock"
OutboxMessage = Event | Heartbeat | Snapshot | ActionReport


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    seq: int
    kind: Kind
    frame: bytes


class Outbox:
    """Unacknowledged messages in sequence order, mirrored to the state store.

    Synchronous and small: each call is one short transaction (or joins the caller's).
    """

    def __init__(
        self,
        state: StateStore | str | Path,
        settings: OutboxSettings | None = None,
        metrics: StreamMetrics | None = None,
    ) -> None:
        self.settings = settings or OutboxSettings()
        self.metrics = metrics or StreamMetrics()
        self._owns_store = not isinstance(state, StateStore)
        self._store = (
            state
            if isinstance(state, StateStore)
            else StateStore(state, durable=self.settings.fsync_events)
        )
        self._dir = self._store.dir
        try:
            self._lock_fd = self._lock()
        except OSError as exc:
            raise ConfigError(f"state dir {self._dir} is not usable: {exc}") from exc
        self.stream_id = self._store.stream_id()
        if self._store.corrupt:
            self.metrics.corrupt_records += 1
        self._entries = {
            seq: OutboxEntry(seq, kind, frame) for seq, kind, frame in self._store.outbox_rows()
        }
        self._seqs = sorted(self._entries)
        self._acked, high = self._store.outbox_marks()
        self._next = max(high, self._acked, self._seqs[-1] if self._seqs else 0) + 1
        self._bytes = sum(len(e.frame) for e in self._entries.values())
        self.listener: Callable[[], None] | None = None
        self._warned_over = False
        self._sync_metrics()

    @property
    def store(self) -> StateStore:
        return self._store

    # -- queries --------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._seqs)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    @property
    def acked(self) -> int:
        return self._acked

    @property
    def next_seq(self) -> int:
        return self._next

    def first_unacked_seq(self) -> int:
        """Lowest pending seq, or the next seq to be assigned when nothing is pending."""
        return self._seqs[0] if self._seqs else self._next

    def next_after(self, seq: int) -> OutboxEntry | None:
        """The first pending entry with a sequence number above ``seq``."""
        i = bisect.bisect_right(self._seqs, seq)
        return self._entries[self._seqs[i]] if i < len(self._seqs) else None

    def count_through(self, seq: int) -> int:
        """How many pending entries have a sequence number <= ``seq`` (sent, not yet acked)."""
        return bisect.bisect_right(self._seqs, seq)

    def entries(self) -> list[OutboxEntry]:
        return [self._entries[s] for s in self._seqs]

    # -- mutations ------------------------------------------------------------------------

    def append(self, make: Callable[[int], OutboxMessage]) -> OutboxEntry:
        """Assign the next sequence number, build the message with it, store and return it."""
        seq = self._next
        msg = make(seq)
        kind: Kind = (
            "event"
            if isinstance(msg, Event)
            else "heartbeat"
            if isinstance(msg, Heartbeat)
            else "report"
            if isinstance(msg, ActionReport)
            else "snapshot"
        )
        frame = encode(msg)
        decode_agent(frame)  # never store a frame the controller would reject: it would block
        if len(frame) > MAX_FRAME_BYTES:
            raise ProtocolError(
                "too-large", f"{kind} of {len(frame)} bytes exceeds the frame limit"
            )
        self._next = seq + 1
        entry = OutboxEntry(seq, kind, frame)
        with self._store.transaction():
            self._count_failure(self._store.outbox_put(seq, kind, frame))
            if kind == "snapshot":
                for old in [s for s in self._seqs if self._entries[s].kind == "snapshot"]:
                    self._drop(old, count=False)
            self._entries[seq] = entry
            self._seqs.append(seq)
            self._bytes += len(frame)
            self._enforce_bounds()
        self._sync_metrics()
        if self.listener is not None:
            self.listener()
        return entry

    def ack(self, seq: int) -> int:
        """Cumulative acknowledgement: prune everything <= seq. Returns how many were pruned."""
        if seq <= self._acked:
            return 0
        self._acked = seq
        self._next = max(self._next, seq + 1)
        i = bisect.bisect_right(self._seqs, seq)
        for s in self._seqs[:i]:
            self._bytes -= len(self._entries.pop(s).frame)
        del self._seqs[:i]
        self._count_failure(self._store.outbox_ack(seq))
        self._sync_metrics()
        return i

    def close(self) -> None:
        """Release the state-dir lock (idempotent); a store the outbox opened itself is
        closed too (a shared one stays open for its owner)."""
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            if self._owns_store:
                self._store.close()
        self._lock_fd = -1

    def _lock(self) -> int:
        """Take an exclusive lock on the state dir: two agents must never share one outbox."""
        fd = os.open(self._dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            raise ConfigError(f"state dir {self._dir} is in use by another agent") from exc
        return fd

    # -- internals ------------------------------------------------------------------------

    def _count_failure(self, written: bool) -> None:
        """A failed write (disk full, I/O error) is logged by the store and counted here,
        never raised: the message stays in memory and is still sent while connected; only
        its durability across an agent restart is lost."""
        if not written:
            self.metrics.outbox_write_errors += 1

    def _drop(self, seq: int, *, count: bool = True) -> None:
        entry = self._entries.pop(seq)
        self._seqs.remove(seq)
        self._bytes -= len(entry.frame)
        self._count_failure(self._store.outbox_delete(seq))
        if count:
            self.metrics.dropped[entry.kind] += 1

    def _over(self) -> bool:
        s = self.settings
        return len(self._seqs) > s.max_messages or self._bytes > s.max_bytes

    def _enforce_bounds(self) -> None:
        if not self._over():
            self._warned_over = False
            return
        # Only heartbeats are droppable: at most one snapshot is ever pending (a new one
        # supersedes the old), and events are health facts.
        for s in [s for s in self._seqs if self._entries[s].kind == "heartbeat"]:
            if not self._over():
                break
            self._drop(s)
        if self._over() and not self._warned_over:
            self._warned_over = True
            log.warning(
                "outbox_over_bound_with_events", messages=len(self._seqs), bytes=self._bytes
            )

    def _sync_metrics(self) -> None:
        self.metrics.outbox_messages = len(self._seqs)
