"""The agent's one state store: SQLite (standard library) in the state dir, ``state.db``.

Everything the agent keeps across a restart lives here, so that related facts commit together
(:meth:`StateStore.transaction`): the engine driver handles one observation in one
transaction, so the outbox Event of an XID, the latched verdicts it raised and the kernel-log
position past its line are all on disk, or none is (a crash in between reads the line again).

Schema (``PRAGMA user_version`` 1):

- ``outbox(seq, kind, frame)``: unacknowledged stream messages (the encoded protocol frames),
  replayed in ``seq`` order; an Ack deletes every row ``<= seq``
  (:class:`~gpuhealth.agent.stream.outbox.Outbox` keeps its bounds and metrics);
- ``boot_state(name, boot_id, value)``: what holds for one boot only, each a JSON document:
  ``latched`` (the XID/ECC verdicts, :class:`LatchedStore`), ``kmsg_position`` (the kernel-log
  follower's position), ``dcgm_xid`` (the dcgm-exporter XID baseline), ``cper_seen`` (the CPER
  record ids the NVML source handled); read back only on the boot that wrote it;
- ``orders(order_id, n, entry)``: the results of recent remediation orders (at most once per
  order id, across restarts);
- ``meta(key, value)``: the stream id and the outbox's acknowledged and highest sequence
  numbers (never reused).

The database runs in WAL mode; ``synchronous=FULL`` for a durable store (the agent's with a
controller: every commit is on disk before it returns, what ``stream.outbox.fsync_events``
promises for the outbox) and ``NORMAL`` otherwise (a process crash loses nothing, a power
loss the last commits: latched verdicts and positions describe one boot, which a power loss
ends). Commits are small (one row or a few) and run on the event loop, as the fsync of the
outbox log they replace did: the kernel-log XID must be in the outbox before the follower
reads its next line. What blocks longer, the checkpoint that copies the write-ahead log into
the database, runs in a worker thread on its own connection
(:meth:`StateStore.checkpoint_loop`, the agent's ``state-checkpoint`` task every
``state_checkpoint_interval_s``), never on the event loop.

Every write runs on the event loop (the checkpoint's worker thread only copies the log, on
a connection of its own). The store's connection may be used from another thread (it is
opened with ``check_same_thread=False``, and every statement and transaction holds
``self._lock``), but a thread that has something to keep hands it to the loop
(``loop.call_soon_threadsafe``), where it joins the transaction of what it belongs with
(:class:`~gpuhealth.agent.sources.nvml.cper.CperSeenIds`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import msgspec

from gpuhealth.common.clock import Clock
from gpuhealth.common.errors import ConfigError
from gpuhealth.common.logging import get_logger
from gpuhealth.protocol import Condition

log = get_logger("agent.state")

DB_NAME = "state.db"
SCHEMA_VERSION = 1
Kind = Literal["event", "heartbeat", "snapshot", "report"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY,
    kind TEXT NOT NULL CHECK (kind IN ('event', 'heartbeat', 'snapshot', 'report')),
    frame BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS boot_state (
    name TEXT PRIMARY KEY, boot_id TEXT NOT NULL, value BLOB NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS orders (
    order_id TEXT PRIMARY KEY, n INTEGER NOT NULL, entry BLOB NOT NULL
) WITHOUT ROWID;
"""


class StateStore:
    """One connection to ``state.db``; every write goes through :meth:`transaction`."""

    def __init__(
        self, state_dir: str | Path, *, durable: bool = True, background_checkpoint: bool = False
    ) -> None:
        """Open (create) the store; raises :class:`ConfigError` when the state dir is not
        usable. A file that is not a database is moved aside and a new store started
        (``corrupt`` is then True). ``background_checkpoint``: commits never checkpoint the
        write-ahead log themselves; :meth:`checkpoint_loop` must run (else SQLite does it
        in the commit that fills ``wal_autocheckpoint`` pages)."""
        self.dir = Path(state_dir)
        self.path = self.dir / DB_NAME
        self.corrupt = False
        self.write_errors = 0
        self._lock = threading.RLock()
        self._depth = 0
        self._failed = False
        self._open_tx = False
        self._background_checkpoint = background_checkpoint
        self._checkpointer: sqlite3.Connection | None = None
        self.checkpoints = 0
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            try:
                self._db = self._open(durable)
            except sqlite3.DatabaseError as exc:
                if isinstance(exc, sqlite3.OperationalError) and not self.path.exists():
                    raise
                aside = self.path.with_name(f"{DB_NAME}.corrupt-{int(time.time())}")
                log.error("state_store_corrupt", path=str(self.path), moved_to=str(aside))
                os.replace(self.path, aside)
                for suffix in ("-wal", "-shm"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(f"{self.path}{suffix}")
                self.corrupt = True
                self._db = self._open(durable)
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(f"state dir {self.dir} is not usable: {exc}") from exc

    @classmethod
    def of(cls, where: StateStore | str | Path) -> StateStore:
        """``where`` itself, or a store opened in that state dir."""
        return where if isinstance(where, StateStore) else cls(where)

    def _open(self, durable: bool) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=10.0)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
            if self._background_checkpoint:
                db.execute("PRAGMA wal_autocheckpoint=0")
            self._check_version(db.execute("PRAGMA user_version").fetchone()[0])
            db.executescript(_SCHEMA)
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except BaseException:
            db.close()
            raise
        return db

    def _check_version(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise ConfigError(
                f"{self.path} has schema {version}, newer than this agent's "
                f"{SCHEMA_VERSION}: a downgrade needs a fresh state dir"
            )

    def close(self) -> None:
        """Close the store (the last connection to close checkpoints the log)."""
        with self._lock:
            if self._checkpointer is not None:
                self._checkpointer.close()
                self._checkpointer = None
            self._db.close()

    async def checkpoint_loop(self, clock: Clock, interval_s: float) -> None:
        """Every ``interval_s``: copy the write-ahead log into the database, in a worker
        thread on a connection of its own (a PASSIVE checkpoint: writers are never waited
        for; what they hold is copied the next time)."""
        while True:
            await clock.sleep(interval_s)
            await asyncio.to_thread(self.checkpoint)

    def checkpoint(self) -> tuple[int, int]:
        """(frames in the log, frames copied); blocking: call it off the event loop."""
        if self._checkpointer is None:
            self._checkpointer = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=10.0
            )
        try:
            _, frames, copied = self._checkpointer.execute(
                "PRAGMA wal_checkpoint(PASSIVE)"
            ).fetchone()
        except sqlite3.Error as exc:
            log.warning("state_store_checkpoint_failed", path=str(self.path), error=str(exc))
            return 0, 0
        self.checkpoints += 1
        return int(frames), int(copied)

    # -- transactions ---------------------------------------------------------------------

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Everything written inside commits together, when the outermost one ends (nested
        transactions join it; one that wrote nothing costs nothing). An exception rolls it
        back and propagates; a failed write (disk full, I/O error) is logged and counted,
        not raised, and rolls back the whole
        transaction: what it held stays in memory (the outbox still sends it) and is
        written again by a later change where it is state (latched, positions)."""
        with self._lock:
            if self._depth == 0:
                self._failed = False
                self._open_tx = False  # BEGIN at the first write: no write, no commit
            self._depth += 1
            ok = False
            try:
                yield
                ok = True
            finally:
                self._depth -= 1
                if self._depth == 0 and self._open_tx:
                    self._end(commit=ok and not self._failed)

    def _end(self, *, commit: bool) -> None:
        self._open_tx = False
        try:
            self._db.execute("COMMIT" if commit else "ROLLBACK")
        except sqlite3.Error as exc:
            self._write_failed(exc)
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")

    def _write(self, sql: str, args: tuple[object, ...] = ()) -> bool:
        """One statement inside a transaction (one of its own when none is open)."""
        with self.transaction():
            if self._failed:
                return False
            try:
                if not self._open_tx:
                    self._db.execute("BEGIN IMMEDIATE")
                    self._open_tx = True
                self._db.execute(sql, args)
            except sqlite3.Error as exc:
                self._write_failed(exc)
                self._failed = True
                return False
            return True

    def raise_meta(self, key: str, value: int) -> bool:
        """``meta[key] = max(meta[key], value)``."""
        return self._write(
            "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET"
            " value = CAST(max(CAST(value AS INTEGER), CAST(excluded.value AS INTEGER)) AS TEXT)",
            (key, str(value)),
        )

    def _write_failed(self, exc: sqlite3.Error) -> None:
        self.write_errors += 1
        log.error("state_store_write_failed", path=str(self.path), error=str(exc))

    def _read(self, sql: str, args: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        with self._lock:
            return list(self._db.execute(sql, args).fetchall())

    # -- meta -----------------------------------------------------------------------------

    def meta(self, key: str) -> str | None:
        rows = self._read("SELECT value FROM meta WHERE key = ?", (key,))
        return str(rows[0][0]) if rows else None

    def set_meta(self, key: str, value: str) -> bool:
        return self._write("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def stream_id(self) -> str:
        """This state dir's stream id (the controller tells a new outbox from a restart)."""
        sid = self.meta("stream_id")
        if sid is None:
            sid = secrets.token_hex(16)
            self.set_meta("stream_id", sid)
        return sid

    # -- outbox ---------------------------------------------------------------------------

    def outbox_rows(self) -> list[tuple[int, Kind, bytes]]:
        return [
            (int(seq), kind, bytes(frame))  # type: ignore[call-overload, misc]
            for seq, kind, frame in self._read("SELECT seq, kind, frame FROM outbox ORDER BY seq")
        ]

    def outbox_marks(self) -> tuple[int, int]:
        """(the highest acknowledged seq, the highest seq ever assigned)."""
        return int(self.meta("outbox_acked") or 0), int(self.meta("outbox_high") or 0)

    def outbox_put(self, seq: int, kind: Kind, frame: bytes) -> bool:
        with self.transaction():
            return self._write(
                "INSERT OR REPLACE INTO outbox (seq, kind, frame) VALUES (?, ?, ?)",
                (seq, kind, frame),
            ) and self.raise_meta("outbox_high", seq)

    def outbox_ack(self, seq: int) -> bool:
        with self.transaction():
            return (
                self._write("DELETE FROM outbox WHERE seq <= ?", (seq,))
                and self.raise_meta("outbox_acked", seq)
                and self.raise_meta("outbox_high", seq)
            )

    def outbox_delete(self, seq: int) -> bool:
        return self._write("DELETE FROM outbox WHERE seq = ?", (seq,))

    # -- per-boot documents ---------------------------------------------------------------

    def boot_value(self, name: str, boot_id: str) -> tuple[bytes | None, bool]:
        """(the document ``name`` written on ``boot_id``, whether one of an earlier boot was
        there instead)."""
        rows = self._read("SELECT boot_id, value FROM boot_state WHERE name = ?", (name,))
        if not rows:
            return None, False
        saved_boot, value = rows[0]
        if saved_boot != boot_id:
            return None, True
        return bytes(value), False  # type: ignore[call-overload]

    def put_boot_value(self, name: str, boot_id: str, value: bytes) -> bool:
        return self._write(
            "INSERT OR REPLACE INTO boot_state (name, boot_id, value) VALUES (?, ?, ?)",
            (name, boot_id, value),
        )

    # -- remediation orders ---------------------------------------------------------------

    def order_rows(self, limit: int) -> list[bytes]:
        """The newest ``limit`` order results, oldest first."""
        rows = self._read(
            "SELECT entry FROM (SELECT n, entry FROM orders ORDER BY n DESC LIMIT ?) ORDER BY n",
            (limit,),
        )
        return [bytes(r[0]) for r in rows]  # type: ignore[call-overload]

    def put_order(self, order_id: str, entry: bytes, keep: int) -> bool:
        with self.transaction():
            return self._write(
                "INSERT OR REPLACE INTO orders (order_id, n, entry) VALUES"
                " (?, (SELECT coalesce(max(n), 0) + 1 FROM orders), ?)",
                (order_id, entry),
            ) and self._write(
                "DELETE FROM orders WHERE n <= (SELECT max(n) FROM orders) - ?", (keep,)
            )


class LatchedStore:
    """Latched verdicts (XID, ECC) per boot, so an agent restart never clears them.

    A verdict latches until a GPU reset, a reboot or an operator clear; restarting the agent
    (a DaemonSet rollout, an OOM kill) is none of those. After a reboot the saved verdicts
    are ignored, because a reboot is a recovery."""

    NAME = "latched"

    def __init__(self, store: StateStore | str | Path, boot_id: str) -> None:
        self._store = StateStore.of(store)
        self._boot_id = boot_id
        self._last: dict[str, list[Condition]] | None = None
        self._errors_seen = self._store.write_errors

    @property
    def store(self) -> StateStore:
        return self._store

    def load(self) -> dict[str, list[Condition]]:
        """Verdicts saved on this boot; empty after a reboot or when unreadable."""
        raw, _ = self._store.boot_value(self.NAME, self._boot_id)
        if raw is None:
            return {}
        try:
            latched = msgspec.json.decode(raw, type=dict[str, list[Condition]])
        except msgspec.DecodeError as exc:
            log.warning("latched_unreadable", error=str(exc))
            return {}
        self._last = latched
        return latched

    def save(self, latched: dict[str, list[Condition]]) -> None:
        """Write when the latched set changed (or a write of the store failed since: a failed
        transaction rolled back what it held); an I/O error is logged, not raised."""
        errors = self._store.write_errors
        if latched == self._last and errors == self._errors_seen:
            return
        self._errors_seen = errors
        if self._store.put_boot_value(self.NAME, self._boot_id, msgspec.json.encode(latched)):
            self._last = latched
