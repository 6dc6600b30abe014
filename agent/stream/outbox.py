"""The durable, bounded outbox: unacknowledged agent messages on disk, replayed in order.

Format: one append-only log file (``outbox.log``) of records, each
``<type u8><seq u64><length u32><crc32 u32><payload>`` (little-endian; the CRC covers type,
seq, length and payload). Record types: a message (event, heartbeat, snapshot or a
remediation action report; payload is the encoded protocol frame), ``ACK`` (everything <= seq
is acknowledged), ``DROP`` (one message dropped by the bound policy) and ``SEQ`` (high-water
mark of assigned sequence numbers, so a sequence number is never reused after compaction).
Loading replays the records; the first record that is short, fails its CRC or does not
decode ends the log: the file is truncated there and the loss counted (a torn tail after a
crash), never fatal. When dead records
outnumber live ones the log is rewritten to a temporary file, fsynced and renamed over.

Why not sqlite3: the workload is a FIFO with a watermark; an append-only log makes the crash
semantics (torn tail) explicit and testable, costs one ``write`` per message, and needs no
schema migrations. fsync policy: see :class:`~gpuhealth.agent.stream.settings.OutboxSettings`.
"""

from __future__ import annotations

import bisect
import fcntl
import os
import secrets
from collections.abc import Callable
from pathlib import Path

from gpuhealth.agent.stream.logfile import (
    TYPE_OF,
    Entry,
    Kind,
    OutboxMessage,
    RecordType,
    encode_record,
    parse_log,
)
from gpuhealth.agent.stream.metrics import StreamMetrics
from gpuhealth.agent.stream.settings import OutboxSettings
from gpuhealth.common.errors import ConfigError
from gpuhealth.common.logging import get_logger
from gpuhealth.protocol import MAX_FRAME_BYTES, Event, Heartbeat, ProtocolError, encode
from gpuhealth.protocol.codec import decode_agent
from gpuhealth.protocol.remediation import ActionReport

__all__ = ["LOG_NAME", "Entry", "Outbox", "OutboxMessage", "RecordType", "encode_record"]

log = get_logger("agent.outbox")
LOG_NAME = "outbox.log"
STREAM_ID_NAME = "stream_id"
LOCK_NAME = "outbox.lock"


class Outbox:
    """Unacknowledged messages in sequence order, mirrored to an append-only log.

    Synchronous and small: every call is a few syscalls at most, fine on the event loop.
    """

    def __init__(
        self,
        state_dir: str | Path,
        settings: OutboxSettings | None = None,
        metrics: StreamMetrics | None = None,
    ) -> None:
        self.settings = settings or OutboxSettings()
        self.metrics = metrics or StreamMetrics()
        self._dir = Path(state_dir)
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
            self._lock_fd = self._lock()
            self.stream_id = self._load_stream_id()
            loaded = parse_log(self._read_log())
        except OSError as exc:
            raise ConfigError(f"state dir {self._dir} is not usable: {exc}") from exc
        if loaded.corrupt:
            self.metrics.corrupt_records += 1
            log.warning(
                "outbox_corrupt_tail_truncated", path=str(self._path), offset=loaded.good_bytes
            )
        self._entries = loaded.entries
        self._seqs = sorted(loaded.entries)
        self._acked = loaded.acked
        self._next = loaded.high + 1
        self._records = loaded.records
        self._bytes = sum(len(e.frame) for e in self._entries.values())
        self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.ftruncate(self._fd, loaded.good_bytes)
        self._offset = loaded.good_bytes
        self.listener: Callable[[], None] | None = None
        self._warned_over = False
        self._sync_metrics()

    @property
    def _path(self) -> Path:
        return self._dir / LOG_NAME

    def _read_log(self) -> bytes:
        try:
            return self._path.read_bytes()
        except FileNotFoundError:
            return b""

    def _load_stream_id(self) -> str:
        path = self._dir / STREAM_ID_NAME
        try:
            sid = path.read_text(encoding="ascii").strip()
            if 0 < len(sid) <= 64:
                return sid
        except FileNotFoundError:
            pass
        sid = secrets.token_hex(16)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(sid, encoding="ascii")
        os.replace(tmp, path)
        return sid

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

    def next_after(self, seq: int) -> Entry | None:
        """The first pending entry with a sequence number above ``seq``."""
        i = bisect.bisect_right(self._seqs, seq)
        return self._entries[self._seqs[i]] if i < len(self._seqs) else None

    def count_through(self, seq: int) -> int:
        """How many pending entries have a sequence number <= ``seq`` (sent, not yet acked)."""
        return bisect.bisect_right(self._seqs, seq)

    def entries(self) -> list[Entry]:
        return [self._entries[s] for s in self._seqs]

    # -- mutations ------------------------------------------------------------------------

    def append(self, make: Callable[[int], OutboxMessage]) -> Entry:
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
        self._write_or_count(
            encode_record(TYPE_OF[kind], seq, frame),
            sync=kind in ("event", "report") and self.settings.fsync_events,
        )
        self._next = seq + 1
        entry = Entry(seq, kind, frame)
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
        self._write_or_count(encode_record(RecordType.ACK, seq), sync=False)
        self._maybe_compact()
        self._sync_metrics()
        return i

    def close(self) -> None:
        """Close the log and release the state-dir lock (idempotent)."""
        for fd in (self._fd, self._lock_fd):
            if fd >= 0:
                os.close(fd)
        self._fd = self._lock_fd = -1

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

    def _write_or_count(self, record: bytes, *, sync: bool) -> None:
        """A failed write (disk full, I/O error) is logged and counted, never raised: the
        message stays in memory and is still sent while connected; only its durability
        across an agent restart is lost."""
        try:
            self._write(record, sync=sync)
        except OSError as exc:
            self.metrics.outbox_write_errors += 1
            log.error("outbox_write_failed", path=str(self._path), error=str(exc))

    def _write(self, record: bytes, *, sync: bool) -> None:
        """Append one record; on failure the file is cut back so no torn record remains."""
        try:
            n = os.write(self._fd, record)
            if n == len(record) and sync:
                os.fsync(self._fd)
        except OSError:
            os.ftruncate(self._fd, self._offset)
            raise
        if n != len(record):
            os.ftruncate(self._fd, self._offset)
            raise OSError(f"short write {n}/{len(record)} to {self._path}")
        self._offset += len(record)
        self._records += 1

    def _drop(self, seq: int, *, count: bool = True) -> None:
        entry = self._entries.pop(seq)
        self._seqs.remove(seq)
        self._bytes -= len(entry.frame)
        self._write_or_count(encode_record(RecordType.DROP, seq), sync=False)
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
        self._maybe_compact()

    def _maybe_compact(self) -> None:
        dead = self._records - len(self._seqs)
        if dead >= self.settings.compact_min_dead and dead > len(self._seqs):
            self.compact()

    def compact(self) -> None:
        """Rewrite the log with only the live messages (atomic: temp file, fsync, rename)."""
        parts = [
            encode_record(RecordType.SEQ, self._next - 1),
            encode_record(RecordType.ACK, self._acked),
        ]
        parts += [
            encode_record(TYPE_OF[e.kind], e.seq, e.frame)
            for e in (self._entries[s] for s in self._seqs)
        ]
        data = b"".join(parts)
        tmp = self._path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self._path)
        os.close(self._fd)
        self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND)
        self._offset = len(data)
        self._records = len(parts)
        dfd = os.open(self._dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def _sync_metrics(self) -> None:
        self.metrics.outbox_messages = len(self._seqs)
