"""Receiving the controller's orders: each order id is executed at most once.

:meth:`OrderHandler.receive` is called by the stream client for every order frame (it never
blocks). A frame whose ``seq`` is not above the last one on this connection is a duplicate
and dropped. An order id the journal knows is answered with its stored result; one still
running is answered ``running``; anything else starts a named task that executes it and
reports through ``report`` (the outbox, which assigns the report's sequence number and keeps
it until the controller acknowledges it). With ``enabled: false`` every order is refused, and
so is every order on a plaintext stream (``ws://``) unless ``allow_plaintext_orders``; each
refusal before execution is counted by reason (``gpuhealth_agent_orders_refused_total``).

A :class:`CancelOrder` (an aborted episode) stops the order it names while it can still be
stopped: a validation at any time, a reboot during its delay (``reboot.delay_s``), a GPU
reset before its command starts; a reset whose command runs and a reboot handed to its
executor are past that point (``too-late``). An order the agent has not received yet is
recorded as cancelled, so if it arrives later it is refused (``cancelled``). The cancel's
own answer is journalled like every order's: a repeated cancel gets the same answer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable

from gpuhealth.agent.remediation.order_results import JournalEntry, OrderJournal, Outcome
from gpuhealth.agent.remediation.reboot import RebootExecutor
from gpuhealth.agent.remediation.reset import GpuResetter
from gpuhealth.agent.remediation.settings import AgentRemediationSettings
from gpuhealth.agent.remediation.validation_checks import Validator
from gpuhealth.common.clock import Clock
from gpuhealth.common.logging import get_logger
from gpuhealth.protocol.remediation import (
    ActionKind,
    ActionReport,
    CancelOrder,
    Order,
    RebootOrder,
    ResetGpuOrder,
    ValidateOrder,
)

log = get_logger("remediation.orders")

ReportSink = Callable[[Callable[[int], ActionReport]], None]
"""Appends a report; the callable gets the sequence number the outbox assigns."""

FINAL = frozenset({"succeeded", "failed", "refused"})
PLAINTEXT = "plaintext-stream"


def capabilities(
    settings: AgentRemediationSettings, installed: Callable[[tuple[str, ...]], bool]
) -> list[str]:
    """What this agent can execute (its Hello, ``gpuhealth.protocol.v1.CAPABILITIES``): nothing
    while remediation is off; a reboot only with an executor; the diagnostic only when its program
    is installed."""
    if not settings.enabled:
        return []
    caps = ["reset-gpu", "validate"]
    if settings.reboot.executor != "none":
        caps.append("reboot")
    if installed(settings.validation.diagnostic_command):
        caps.append("diagnostic")
    return caps


def kind_of(order: Order) -> ActionKind:
    if isinstance(order, ResetGpuOrder):
        return "reset-gpu"
    if isinstance(order, RebootOrder):
        return "reboot"
    if isinstance(order, ValidateOrder):
        return "validate"
    return "cancel"


class OrderHandler:
    def __init__(
        self,
        settings: AgentRemediationSettings,
        *,
        node: str,
        boot_id: str,
        resetter: GpuResetter,
        rebooter: RebootExecutor,
        validator: Validator,
        journal: OrderJournal,
        report: ReportSink,
        clock: Clock,
        encrypted: bool = True,
        refused: Counter[str] | None = None,
    ) -> None:
        """``encrypted``: the stream the orders come on is TLS (``wss://``); ``refused``
        counts the orders refused before execution, by reason."""
        self._settings = settings
        self._node = node
        self._boot_id = boot_id
        self._resetter = resetter
        self._rebooter = rebooter
        self._validator = validator
        self._journal = journal
        self._report = report
        self._clock = clock
        self._encrypted = encrypted
        self.refused: Counter[str] = refused if refused is not None else Counter()
        self._running: dict[str, asyncio.Task[None]] = {}
        self._committed: set[str] = set()
        """Running orders past the point where a cancel can stop them."""
        self._last_seq = 0
        self.dropped_duplicates = 0

    def connection_started(self) -> None:
        """A new stream: its order ``seq`` numbers start again from 1."""
        self._last_seq = 0

    def receive(self, order: Order) -> None:
        if order.seq <= self._last_seq:
            self.dropped_duplicates += 1
            log.warning("remediation_order_duplicate_frame", order=order.order_id, seq=order.seq)
            return
        self._last_seq = order.seq
        if not self._settings.enabled:
            self._refuse(order, "disabled", "remediation is off on this agent")
            return
        if not self._encrypted and not self._settings.allow_plaintext_orders:
            self._refuse(
                order,
                PLAINTEXT,
                "the stream is not TLS (ws://): orders are refused unless "
                "remediation.allow_plaintext_orders",
            )
            return
        if isinstance(order, CancelOrder):
            self._cancel(order)
            return
        known = self._journal.get(order.order_id)
        if known is not None:
            self._send(order, known.outcome())
            return
        if order.order_id in self._running:
            self._send(order, Outcome("running", message="in progress"))
            return
        task = asyncio.create_task(self._execute(order), name=f"remediation-order-{order.order_id}")
        self._running[order.order_id] = task

    def _refuse(self, order: Order, reason: str, message: str) -> None:
        """Refused before anything is done (not journalled: the same id may come again on a
        stream where it is acceptable, e.g. after the agent is configured)."""
        self.refused[reason] += 1
        log.warning("remediation_order_refused", order=order.order_id, reason=reason)
        self._send(order, Outcome("refused", reason, message), final=False)

    def _send(self, order: Order, outcome: Outcome, *, final: bool = True) -> None:
        kind = kind_of(order)
        if final and outcome.state in FINAL | {"accepted"}:
            self._journal.put(
                JournalEntry(
                    order_id=order.order_id,
                    action=kind,
                    episode=order.episode,
                    state=outcome.state,
                    reason=outcome.reason,
                    message=outcome.message[:1024],
                    processes=list(outcome.processes),
                    checks=list(outcome.checks),
                )
            )
        log.info(
            "remediation_order_report",
            order=order.order_id,
            action=kind,
            state=outcome.state,
            reason=outcome.reason,
        )
        now = self._clock.now()
        self._report(
            lambda seq: ActionReport(
                seq=seq,
                node=self._node,
                order_id=order.order_id,
                episode=order.episode,
                action=kind,
                state=outcome.state,
                at=now,
                boot_id=self._boot_id[:128],
                reason=outcome.reason,
                message=outcome.message[:1024],
                processes=list(outcome.processes),
                checks=list(outcome.checks),
            )
        )

    def _cancel(self, order: CancelOrder) -> None:
        known = self._journal.get(order.order_id)
        if known is not None:  # a repeated cancel: the answer it had
            self._send(order, known.outcome())
            return
        self._send(order, self._stop(order))

    def _stop(self, order: CancelOrder) -> Outcome:
        target = order.cancel_order_id
        task = self._running.get(target)
        if task is not None:
            if target in self._committed:
                return Outcome("refused", "too-late", f"{target} is past the point of stopping")
            task.cancel()
            log.warning("remediation_order_cancelled", order=target, episode=order.episode)
            return Outcome("succeeded", message=f"cancelled {target}")
        done = self._journal.get(target)
        if done is not None:
            if done.state in FINAL:
                return Outcome("refused", "finished", f"{target} already {done.state}")
            return Outcome("refused", "too-late", f"{target} was handed over ({done.state})")
        self._journal.put(
            JournalEntry(
                order_id=target,
                action="unknown",
                episode=order.episode,
                state="refused",
                reason="cancelled",
                message=f"cancelled by {order.order_id} before it arrived",
            )
        )
        return Outcome("succeeded", message=f"{target} will not run")

    def _commit(self, order_id: str) -> Callable[[], None]:
        """Marks ``order_id`` past the point where a cancel can stop it."""
        return lambda: self._committed.add(order_id)

    async def _execute(self, order: Order) -> None:
        try:
            outcome = await self._run(order)
            if outcome is not None:
                self._send(order, outcome)
        except asyncio.CancelledError:
            self._send(order, Outcome("failed", "cancelled", "cancelled by the controller"))
        except Exception as exc:
            log.exception("remediation_order_crashed", order=order.order_id)
            self._send(order, Outcome("failed", "internal", f"{type(exc).__name__}: {exc}"))
        finally:
            self._running.pop(order.order_id, None)
            self._committed.discard(order.order_id)

    async def _run(self, order: Order) -> Outcome | None:
        deadline = getattr(order, "deadline_s", None)
        if isinstance(order, ResetGpuOrder):
            self._send(order, Outcome("running", message="resetting"), final=False)
            reset = self._resetter.reset(order.gpus, committing=self._commit(order.order_id))
            return await self._clock.wait_for(reset, deadline)
        if isinstance(order, ValidateOrder):

            def progress(o: Outcome) -> None:
                self._send(order, o, final=False)

            return await self._clock.wait_for(self._validator.validate(order, progress), deadline)
        if isinstance(order, RebootOrder):
            return await self._reboot(order)
        return Outcome("refused", "unsupported", "unknown order")

    async def _reboot(self, order: RebootOrder) -> Outcome | None:
        if order.expected_boot_id != self._boot_id:
            return Outcome("refused", "boot-id-changed", f"this node runs boot {self._boot_id}")
        self._send(order, Outcome("accepted", message="rebooting"))
        await self._clock.sleep(self._settings.reboot.delay_s)
        self._committed.add(order.order_id)
        result = await self._rebooter.reboot(order, self._node, self._boot_id)
        if result.state != "succeeded":
            return result
        log.warning("node_reboot_handed_over", order=order.order_id, episode=order.episode)
        return None  # the node goes down; the new boot id tells the controller

    def running(self) -> list[str]:
        return sorted(self._running)

    async def stop(self) -> None:
        tasks = list(self._running.values())
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
