"""The agents' action reports, as the stream delivers them (in memory, bounded per node).

Memory is enough: a report that is lost with a controller restart is asked for again,
because the episode resends the same order id after its timeout and the agent answers a
repeat with the result it already has (it keeps results on disk).

A report is kept only under the node whose authenticated stream brought it (the stream
already refuses one naming another node), and at most ``MAX_REPORTS_PER_NODE`` per node,
oldest dropped first: an agent that reports on order ids it was never sent pushes out only
its own node's reports, never another node's. An episode reads only the report of its own
node for the order it holds (``runner.observe``), so a report for any other id is never used.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from gpuhealth.common.logging import get_logger
from gpuhealth.protocol.remediation import ActionReport

log = get_logger("remediation.reports")

MAX_REPORTS_PER_NODE = 16
"""Reports kept per node (oldest dropped first): an episode has one order in flight per node,
so this is many more than a node's honest agent has outstanding. Total memory is bounded by
the nodes with an authenticated agent stream."""


class ReportBook:
    def __init__(self, max_per_node: int = MAX_REPORTS_PER_NODE) -> None:
        self._reports: dict[str, OrderedDict[str, ActionReport]] = {}
        self._max = max_per_node
        self.listener: Callable[[str, ActionReport], None] | None = None
        """Told about every accepted report (the runner enqueues the episode)."""

    def record(self, node: str, report: ActionReport) -> bool:
        """Keep the newest report per (node, order id); a report naming another node (the
        stream is bound to one node) or older than the kept one is ignored."""
        if report.node != node:
            log.warning("report_node_mismatch", node=node, claimed=report.node)
            return False
        book = self._reports.setdefault(node, OrderedDict())
        old = book.get(report.order_id)
        if old is not None and (report.at, report.seq) < (old.at, old.seq):
            return False
        book[report.order_id] = report
        book.move_to_end(report.order_id)
        while len(book) > self._max:
            book.popitem(last=False)
        if self.listener is not None:
            self.listener(node, report)
        return True

    def latest(self, node: str, order_id: str) -> ActionReport | None:
        book = self._reports.get(node)
        return book.get(order_id) if book is not None else None

    def __len__(self) -> int:
        return sum(len(book) for book in self._reports.values())
