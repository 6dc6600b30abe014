"""The order handler: each order id executed at most once (also across a restart),
duplicates answered from the journal, reboots only on the expected boot, off = refused."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpuhealth.agent.remediation.command import CommandResult
from gpuhealth.agent.remediation.nvml_probe import NvmlProbe
from gpuhealth.agent.remediation.order_handler import OrderHandler, capabilities
from gpuhealth.agent.remediation.order_results import JournalEntry, OrderJournal, Outcome
from gpuhealth.agent.remediation.reset import GpuResetter
from gpuhealth.agent.remediation.settings import (
    AgentRemediationSettings,
    RebootExecutorSettings,
    ResetCommandSettings,
    ValidationCheckSettings,
)
from gpuhealth.agent.remediation.validation_checks import Validator
from gpuhealth.agent.state_store import StateStore
from gpuhealth.protocol import GpuInfo, GpuStatus
from gpuhealth.protocol.remediation import (
    ActionReport,
    CancelOrder,
    RebootOrder,
    ResetGpuOrder,
    ValidateOrder,
)
from tests.fakes.fake_pynvml_processes import node_with_processes
from tests.support.clock import FakeClock
from tests.support.wait import until

AT = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)


class Rebooter:
    def __init__(self) -> None:
        self.calls = 0

    async def reboot(self, order: RebootOrder, node: str, boot_id: str) -> Outcome:
        self.calls += 1
        return Outcome("succeeded")


class Setup:
    def __init__(
        self,
        tmp: Path,
        *,
        enabled: bool = True,
        boot: str = "boot-1",
        delay_s: float = 0,
        encrypted: bool = True,
        allow_plaintext: bool = False,
    ) -> None:
        self.nvml = node_with_processes(2)
        self.clock = FakeClock()
        self.resets: list[tuple[str, ...]] = []
        self.reports: list[ActionReport] = []
        self.seq = 0
        self.rebooter = Rebooter()
        self.command_gate: asyncio.Event | None = None
        """When set, a reset command waits for it (a reset in its command)."""
        uuids = [g.uuid for g in self.nvml.gpus]
        statuses = [
            GpuStatus(info=GpuInfo(index=i, uuid=u), state="healthy") for i, u in enumerate(uuids)
        ]

        async def run(argv: tuple[str, ...], timeout_s: float) -> CommandResult:
            self.resets.append(argv)
            if self.command_gate is not None:
                await self.command_gate.wait()
            return CommandResult(0, "")

        probe = NvmlProbe(self.nvml, 1.0)
        settings = AgentRemediationSettings(
            enabled=enabled,
            reboot=RebootExecutorSettings(delay_s=delay_s),
            allow_plaintext_orders=allow_plaintext,
        )
        self.handler = OrderHandler(
            settings,
            node="node-a",
            boot_id=boot,
            resetter=GpuResetter(probe, ResetCommandSettings(), run=run),
            rebooter=self.rebooter,
            validator=Validator(probe, lambda: statuses, ValidationCheckSettings(), self.clock),
            journal=OrderJournal(tmp, 16),
            report=self._report,
            clock=self.clock,
            encrypted=encrypted,
        )

    def _report(self, make) -> None:  # type: ignore[no-untyped-def]
        self.seq += 1
        self.reports.append(make(self.seq))

    def states(self, order_id: str) -> list[str]:
        return [r.state for r in self.reports if r.order_id == order_id]

    async def settle(self) -> None:
        """Every order task has finished (NVML runs in worker threads: real time passes)."""
        await until(lambda: not self.handler.running(), "the orders to finish")


seq = iter(range(1, 10_000))


def reset_order(uuid: str, oid: str = "abc-reset-gpu-1") -> ResetGpuOrder:
    return ResetGpuOrder(
        seq=next(seq), order_id=oid, episode="e", issued_at=AT, deadline_s=60, gpus=[uuid]
    )


def reboot_order(boot: str, oid: str = "abc-reboot-1") -> RebootOrder:
    return RebootOrder(
        seq=next(seq), order_id=oid, episode="e", issued_at=AT, deadline_s=60, expected_boot_id=boot
    )


async def test_an_order_id_is_executed_once_and_repeats_get_the_same_answer(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    uuid = s.nvml.gpus[0].uuid
    s.handler.receive(reset_order(uuid))
    await s.settle()
    s.handler.receive(reset_order(uuid))  # the controller sends it again (restart, timeout)
    await s.settle()
    assert len(s.resets) == 1
    assert s.states("abc-reset-gpu-1") == ["running", "succeeded", "succeeded"]
    assert all(r.node == "node-a" and r.boot_id == "boot-1" for r in s.reports)
    assert [r.seq for r in s.reports] == [1, 2, 3]


async def test_the_journal_survives_an_agent_restart(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    s.handler.receive(reset_order(s.nvml.gpus[0].uuid))
    await s.settle()
    assert len(StateStore(tmp_path).order_rows(10)) == 1
    again = Setup(tmp_path)
    again.handler.receive(reset_order(s.nvml.gpus[0].uuid))
    await again.settle()
    assert again.resets == [] and again.states("abc-reset-gpu-1") == ["succeeded"]


async def test_duplicate_frames_are_dropped_until_a_new_connection(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    order = reset_order(s.nvml.gpus[0].uuid)
    s.handler.receive(order)
    s.handler.receive(order)  # the same frame twice
    await s.settle()
    assert s.handler.dropped_duplicates == 1
    s.handler.connection_started()
    s.handler.receive(ResetGpuOrder(**{**_fields(order), "seq": 1}))
    await s.settle()
    assert len(s.resets) == 1 and s.states(order.order_id)[-1] == "succeeded"


def _fields(o: ResetGpuOrder) -> dict[str, object]:
    return {f: getattr(o, f) for f in o.__struct_fields__}


async def test_reboot_only_on_the_expected_boot_and_reported_before(tmp_path: Path) -> None:
    s = Setup(tmp_path, boot="boot-1")
    s.handler.receive(reboot_order("boot-0", "old-reboot-1"))
    await s.settle()
    assert s.rebooter.calls == 0 and [r.reason for r in s.reports] == ["boot-id-changed"]
    s.handler.receive(reboot_order("boot-1"))
    await s.settle()
    assert s.rebooter.calls == 1
    assert s.states("abc-reboot-1") == ["accepted"]  # reported before the node goes down
    # after the reboot the agent restarts with a new boot id: a repeat does not reboot again
    after = Setup(tmp_path, boot="boot-2")
    after.handler.receive(reboot_order("boot-1"))
    await after.settle()
    assert after.rebooter.calls == 0 and after.states("abc-reboot-1") == ["accepted"]


async def test_disabled_agent_refuses_everything(tmp_path: Path) -> None:
    s = Setup(tmp_path, enabled=False)
    s.handler.receive(reset_order(s.nvml.gpus[0].uuid))
    s.handler.receive(reboot_order("boot-1"))
    await s.settle()
    assert s.resets == [] and s.rebooter.calls == 0
    assert {(r.state, r.reason) for r in s.reports} == {("refused", "disabled")}


async def test_a_running_validation_can_be_cancelled(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    v = ValidateOrder(
        seq=next(seq),
        order_id="abc-validate-1",
        episode="e",
        issued_at=AT,
        deadline_s=600,
        gpus=[s.nvml.gpus[0].uuid],
        soak_s=300,
    )
    s.handler.receive(v)
    await until(lambda: s.states(v.order_id), "the validation to report running")
    assert s.states(v.order_id) == ["running"]
    s.handler.receive(
        CancelOrder(
            seq=next(seq),
            order_id="abc-validate-1-cancel",
            episode="e",
            issued_at=AT,
            cancel_order_id=v.order_id,
        )
    )
    await s.settle()
    assert s.states(v.order_id) == ["running", "failed"]
    assert [r.reason for r in s.reports if r.order_id == v.order_id][-1] == "cancelled"
    assert s.states("abc-validate-1-cancel") == ["succeeded"]


def test_a_corrupt_journal_entry_is_skipped(tmp_path: Path) -> None:
    StateStore(tmp_path).put_order("x", b"{not json", 4)
    j = OrderJournal(tmp_path, 4)
    assert j.load_errors == 1 and j.get("x") is None


def test_the_journal_keeps_the_newest_entries(tmp_path: Path) -> None:
    j = OrderJournal(tmp_path, 2)
    for i in range(4):
        j.put(JournalEntry(order_id=f"o{i}", action="reset-gpu", episode="e", state="succeeded"))
    again = OrderJournal(tmp_path, 2)
    assert [again.get(f"o{i}") is not None for i in range(4)] == [False, False, True, True]


@pytest.mark.parametrize(
    ("settings", "installed", "want"),
    [
        (AgentRemediationSettings(), True, []),  # remediation off: nothing
        (AgentRemediationSettings(enabled=True), False, ["reset-gpu", "validate"]),
        (
            AgentRemediationSettings(
                enabled=True, reboot=RebootExecutorSettings(executor="command")
            ),
            True,
            ["reset-gpu", "validate", "reboot", "diagnostic"],
        ),
    ],
)
def test_the_hello_says_what_the_agent_can_execute(
    settings: AgentRemediationSettings, installed: bool, want: list[str]
) -> None:
    assert capabilities(settings, lambda _argv: installed) == want


def cancel(target: str) -> CancelOrder:
    return CancelOrder(
        seq=next(seq),
        order_id=f"{target}-cancel",
        episode="e",
        issued_at=AT,
        cancel_order_id=target,
    )


async def test_a_reboot_in_its_delay_is_cancelled_and_never_handed_over(tmp_path: Path) -> None:
    """An abort while the reboot waits out reboot.delay_s: the node is not rebooted, the
    cancel is acknowledged, and the order's final word is failed/cancelled."""
    s = Setup(tmp_path, delay_s=30)
    s.handler.receive(reboot_order("boot-1"))
    await until(lambda: s.states("abc-reboot-1"), "the reboot to be accepted")
    s.handler.receive(cancel("abc-reboot-1"))
    await s.settle()
    s.clock.advance(60)  # the delay would have passed
    await asyncio.sleep(0)
    assert s.rebooter.calls == 0
    assert s.states("abc-reboot-1") == ["accepted", "failed"]
    assert s.states("abc-reboot-1-cancel") == ["succeeded"]
    s.handler.receive(reboot_order("boot-1"))  # sent again: the journal's answer, no reboot
    await s.settle()
    assert s.rebooter.calls == 0 and s.states("abc-reboot-1")[-1] == "failed"


async def test_a_reboot_handed_to_its_executor_cannot_be_cancelled(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    s.handler.receive(reboot_order("boot-1"))
    await s.settle()
    s.handler.receive(cancel("abc-reboot-1"))
    await s.settle()
    assert s.rebooter.calls == 1
    (answer,) = [r for r in s.reports if r.order_id == "abc-reboot-1-cancel"]
    assert (answer.state, answer.reason) == ("refused", "too-late")


async def test_an_order_cancelled_before_it_arrives_is_refused_when_it_does(
    tmp_path: Path,
) -> None:
    """The cancel overtook its order (a reconnect, a resend): the order never runs."""
    s = Setup(tmp_path)
    uuid = s.nvml.gpus[0].uuid
    s.handler.receive(cancel("abc-reset-gpu-1"))
    s.handler.receive(reset_order(uuid))
    await s.settle()
    assert s.resets == []
    assert s.states("abc-reset-gpu-1-cancel") == ["succeeded"]
    (answer,) = [r for r in s.reports if r.order_id == "abc-reset-gpu-1"]
    assert (answer.state, answer.reason) == ("refused", "cancelled")
    # the refusal is kept across a restart too
    after = Setup(tmp_path)
    after.handler.receive(reset_order(uuid))
    await after.settle()
    assert after.resets == [] and after.states("abc-reset-gpu-1") == ["refused"]


async def test_a_reset_whose_command_runs_is_not_cancelled(tmp_path: Path) -> None:
    """nvidia-smi --gpu-reset is never killed half-way: the cancel is refused too-late and
    the reset finishes; a repeated cancel gets the same answer."""
    s = Setup(tmp_path)
    s.command_gate = asyncio.Event()
    s.handler.receive(reset_order(s.nvml.gpus[0].uuid))
    await until(lambda: s.resets, "the reset command to start")
    s.handler.receive(cancel("abc-reset-gpu-1"))
    s.handler.receive(cancel("abc-reset-gpu-1"))
    s.command_gate.set()
    await s.settle()
    assert s.states("abc-reset-gpu-1") == ["running", "succeeded"]
    answers = [(r.state, r.reason) for r in s.reports if r.order_id == "abc-reset-gpu-1-cancel"]
    assert answers == [("refused", "too-late"), ("refused", "too-late")]


async def test_orders_on_a_plaintext_stream_are_refused_unless_allowed(tmp_path: Path) -> None:
    """A reset or a reboot must not be injectable by anyone on the network path: on a
    stream that is not TLS every order is refused (counted), unless the documented setting
    allows it (tests and demos on one machine)."""
    s = Setup(tmp_path / "a", encrypted=False)
    s.handler.receive(reset_order(s.nvml.gpus[0].uuid))
    s.handler.receive(reboot_order("boot-1"))
    assert s.handler.running() == [] and s.rebooter.calls == 0 and s.resets == []
    assert {(r.state, r.reason) for r in s.reports} == {("refused", "plaintext-stream")}
    assert s.handler.refused == {"plaintext-stream": 2}
    allowed = Setup(tmp_path / "b", encrypted=False, allow_plaintext=True)
    allowed.handler.receive(reset_order(allowed.nvml.gpus[0].uuid))
    await allowed.settle()
    assert allowed.states("abc-reset-gpu-1") == ["running", "succeeded"]
    assert allowed.handler.refused == {}
