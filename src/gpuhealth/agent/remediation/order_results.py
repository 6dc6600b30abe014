"""What an order's executor answers (:class:`Outcome`) and the results of recent orders, kept:
an order id is executed at most once, also across an agent restart (a repeated order is
answered with the result it already has).

The ``orders`` table of the agent's state store (:mod:`gpuhealth.agent.state_store`): at most
``size`` entries, oldest dropped. An entry that cannot be read is logged and skipped.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import msgspec

from gpuhealth.agent.state_store import StateStore
from gpuhealth.common.logging import get_logger
from gpuhealth.protocol.remediation import CheckResult, GpuProcess

log = get_logger("remediation.journal")

State = Literal["accepted", "running", "succeeded", "failed", "refused"]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an executor answers: the report's state, a short reason code, details."""

    state: State
    reason: str = ""
    """A short code (``gpu-busy``, ``unknown-gpu``, ``boot-id-changed`` ...)."""
    message: str = ""
    processes: tuple[GpuProcess, ...] = ()
    checks: tuple[CheckResult, ...] = field(default=())


class JournalEntry(msgspec.Struct, frozen=True, kw_only=True):
    order_id: str
    action: str
    episode: str
    state: str
    reason: str = ""
    message: str = ""
    processes: list[GpuProcess] = []
    checks: list[CheckResult] = []

    def outcome(self) -> Outcome:
        return Outcome(
            self.state,  # type: ignore[arg-type]
            self.reason,
            self.message,
            tuple(self.processes),
            tuple(self.checks),
        )


class OrderJournal:
    def __init__(self, store: StateStore | str | Path | None, size: int) -> None:
        """``store``: None keeps the results in memory only (this run)."""
        self._store = StateStore.of(store) if store else None
        self._size = size
        self._entries: OrderedDict[str, JournalEntry] = OrderedDict()
        self.load_errors = 0
        self._load()

    def _load(self) -> None:
        if self._store is None:
            return
        for raw in self._store.order_rows(self._size):
            try:
                e = msgspec.json.decode(raw, type=JournalEntry)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                self.load_errors += 1
                log.warning("remediation_journal_unreadable", error=str(exc))
                continue
            self._entries[e.order_id] = e

    def get(self, order_id: str) -> JournalEntry | None:
        return self._entries.get(order_id)

    def put(self, entry: JournalEntry) -> None:
        self._entries[entry.order_id] = entry
        self._entries.move_to_end(entry.order_id)
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)
        if self._store is not None and not self._store.put_order(
            entry.order_id, msgspec.json.encode(entry), self._size
        ):
            log.warning("remediation_journal_write_failed", order=entry.order_id)
