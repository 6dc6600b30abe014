"""The agents' action reports, as the stream delivers them (in memory, bounded).

Memory is enough: a report that is lost with a controller restart is asked for again,
because the episode resends the same order id after its timeout and the agent answers a
repeat with the result it already has (it keeps results on disk).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from gpuhealth.common.logging import get_logger
from gpuhealth.protocol.remediation import ActionReport

log = get_logger("remediation.reports")

MAX_REPORTS = 4096
"""Reports kept (oldest dropped first): far more than episodes in flight."""


class ReportBook:
    def __init__(self, max_reports: int = MAX_REPORTS) -> None:
        self._reports: OrderedDict[tuple[str, str], ActionReport] = OrderedDict()
        self._max = max_reports
        self.listener: Callable[[str, ActionReport], None] | None = None
        """Told about every accepted report (the runner enqueues the episode)."""

    def record(self, node: str, report: ActionReport) -> bool:
        """Keep the newest report per (node, order id); a report naming another node (the
        stream is bound to one node) or older than the kept one is ignored."""
        if report.node != node:
            log.warning("report_node_mismatch", node=node, claimed=report.node)
            return False
        key = (node, report.order_id)
        old = self._reports.get(key)
        if old is not None and (report.at, report.seq) < (old.at, old.seq):
            return False
        self._reports[key] = report
        self._reports.move_to_end(key)
        while len(self._reports) > self._max:
            self._reports.popitem(last=False)
        if self.listener is not None:
            self.listener(node, report)
        return True

    def latest(self, node: str, order_id: str) -> ActionReport | None:
        return self._reports.get((node, order_id))

    def __len__(self) -> int:
        return len(self._reports)
