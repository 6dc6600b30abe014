"""Results of recent orders, on disk: an order id is executed at most once, also across an
agent restart (a repeated order is answered with the result it already has).

One JSON file in the state dir, rewritten atomically (write, fsync, rename); at most
``size`` entries, oldest dropped. A file that cannot be read is logged and replaced.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

import msgspec

from gpuhealth.agent.remediation.outcome import Outcome
from gpuhealth.common.logging import get_logger
from gpuhealth.protocol.remediation import CheckResult, GpuProcess

log = get_logger("remediation.journal")

FILE_NAME = "remediation-orders.json"


class Entry(msgspec.Struct, frozen=True, kw_only=True):
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
    def __init__(self, state_dir: str | Path | None, size: int) -> None:
        self._path = Path(state_dir) / FILE_NAME if state_dir else None
        self._size = size
        self._entries: OrderedDict[str, Entry] = OrderedDict()
        self.load_errors = 0
        self._load()

    def _load(self) -> None:
        if self._path is None or not self._path.exists():
            return
        try:
            entries = msgspec.json.decode(self._path.read_bytes(), type=list[Entry])
        except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            self.load_errors += 1
            log.warning("remediation_journal_unreadable", path=str(self._path), error=str(exc))
            return
        for e in entries[-self._size :]:
            self._entries[e.order_id] = e

    def get(self, order_id: str) -> Entry | None:
        return self._entries.get(order_id)

    def put(self, entry: Entry) -> None:
        self._entries[entry.order_id] = entry
        self._entries.move_to_end(entry.order_id)
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)
        self._save()

    def _save(self) -> None:
        if self._path is None:
            return
        tmp = self._path.with_suffix(".tmp")
        data = msgspec.json.encode(list(self._entries.values()))
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._path)
        except OSError as exc:
            log.warning("remediation_journal_write_failed", path=str(self._path), error=str(exc))
