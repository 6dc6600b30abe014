"""Reboot executors (a node command, a webhook) and the command runner."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from aiohttp import web

from gpuhealth.agent.remediation.command import CommandResult, run_command
from gpuhealth.agent.remediation.reboot import (
    CommandReboot,
    NoReboot,
    WebhookReboot,
    reboot_executor,
)
from gpuhealth.agent.remediation.settings import RebootExecutorSettings
from gpuhealth.protocol.remediation import RebootOrder

ORDER = RebootOrder(
    seq=1,
    order_id="abc-reboot-1",
    episode="ep-1",
    issued_at=datetime(2026, 11, 22, tzinfo=UTC),
    deadline_s=60,
    expected_boot_id="boot-1",
    reason="xid-79",
)


async def test_webhook_gets_the_order_with_the_token(tmp_path: Path) -> None:
    seen: list[tuple[dict[str, object], str]] = []
    status = {"code": 202}

    async def hook(req: web.Request) -> web.Response:
        seen.append((await req.json(), req.headers.get("Authorization", "")))
        return web.Response(status=status["code"], text="queued")

    app = web.Application()
    app.router.add_post("/reboot", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    try:
        cfg = RebootExecutorSettings(
            executor="webhook",
            webhook_url=f"http://127.0.0.1:{port}/reboot",
            webhook_token_file=str(token),
        )
        out = await reboot_executor(cfg).reboot(ORDER, "node-a", "boot-1")
        assert out.state == "succeeded"
        body, auth = seen[0]
        assert body == {
            "node": "node-a",
            "bootId": "boot-1",
            "orderId": "abc-reboot-1",
            "episode": "ep-1",
            "reason": "xid-79",
        }
        assert auth == "Bearer s3cret"
        status["code"] = 500
        out = await WebhookReboot(cfg).reboot(ORDER, "node-a", "boot-1")
        assert (out.state, out.reason) == ("failed", "webhook-refused")
    finally:
        await runner.cleanup()
    out = await WebhookReboot(cfg).reboot(ORDER, "node-a", "boot-1")
    assert (out.state, out.reason) == ("failed", "webhook-unreachable")


async def test_command_executor_and_none() -> None:
    calls: list[tuple[str, ...]] = []

    async def run(argv: tuple[str, ...], timeout_s: float) -> CommandResult:
        calls.append(argv)
        return CommandResult(0 if len(calls) == 1 else 1, "Failed to talk to init daemon")

    ex = CommandReboot(RebootExecutorSettings(executor="command"), run=run)
    assert (await ex.reboot(ORDER, "n", "b")).state == "succeeded"
    out = await ex.reboot(ORDER, "n", "b")
    assert (out.state, out.reason) == ("failed", "command-failed") and "init daemon" in out.message
    assert calls[0] == ("systemctl", "reboot")
    assert (await NoReboot().reboot(ORDER, "n", "b")).reason == "no-executor"
    assert isinstance(reboot_executor(RebootExecutorSettings()), NoReboot)


def test_webhook_needs_a_url() -> None:
    from gpuhealth.common.config import SettingError

    with pytest.raises(SettingError):
        RebootExecutorSettings(executor="webhook").check()


async def test_run_command_exit_codes_output_and_deadline() -> None:
    ok = await run_command(("sh", "-c", "echo hello; echo oops >&2"), 5)
    assert ok.returncode == 0 and "hello" in ok.output and "oops" in ok.output
    bad = await run_command(("sh", "-c", "exit 3"), 5)
    assert bad.returncode == 3
    slow = await run_command(("sleep", "5"), 0.2)
    assert slow.returncode is None and "did not finish" in slow.output
    missing = await run_command(("/nonexistent/tool",), 1)
    assert missing.returncode is None and "cannot run" in missing.output
    assert json.dumps(ok.output)
