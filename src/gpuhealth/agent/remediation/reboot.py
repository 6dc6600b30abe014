"""Reboot executors: a node command, or a webhook for cloud and BMC APIs.

The handler checks the boot id before calling one (an order meant for an earlier boot is
refused ``boot-id-changed``) and reports ``accepted`` first, so the report is in the outbox
before the node goes down; the controller sees the reboot done when the next Hello brings
a new boot id.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import aiohttp

from gpuhealth.agent.remediation.command import Runner, run_command
from gpuhealth.agent.remediation.order_results import Outcome
from gpuhealth.agent.remediation.settings import RebootExecutorSettings
from gpuhealth.protocol.remediation import RebootOrder


class RebootExecutor(Protocol):
    async def reboot(self, order: RebootOrder, node: str, boot_id: str) -> Outcome:
        """``succeeded`` when the reboot was handed over (the node goes down after)."""


class NoReboot:
    async def reboot(self, order: RebootOrder, node: str, boot_id: str) -> Outcome:
        return Outcome("refused", "no-executor", "remediation.reboot.executor is none")


class CommandReboot:
    def __init__(self, settings: RebootExecutorSettings, run: Runner = run_command) -> None:
        self._settings = settings
        self._run = run

    async def reboot(self, order: RebootOrder, node: str, boot_id: str) -> Outcome:
        result = await self._run(self._settings.command, self._settings.timeout_s)
        if result.returncode != 0:
            why = result.output.strip()[-500:] or f"exit status {result.returncode}"
            return Outcome("failed", "command-failed", why)
        return Outcome("succeeded", message="reboot command accepted")


class WebhookReboot:
    """POST ``{node, bootId, orderId, episode, reason}`` (JSON) to the configured URL, with a
    bearer token from ``webhook_token_file`` when set; any 2xx hands the reboot over."""

    def __init__(self, settings: RebootExecutorSettings) -> None:
        self._settings = settings

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        path = self._settings.webhook_token_file
        if path:
            token = Path(path).read_text(encoding="utf-8").strip()
            headers["Authorization"] = f"Bearer {token}"
        return headers

    async def reboot(self, order: RebootOrder, node: str, boot_id: str) -> Outcome:
        body = {
            "node": node,
            "bootId": boot_id,
            "orderId": order.order_id,
            "episode": order.episode,
            "reason": order.reason,
        }
        timeout = aiohttp.ClientTimeout(total=self._settings.timeout_s)
        try:
            headers = self._headers()
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.post(self._settings.webhook_url, json=body, headers=headers) as resp,
            ):
                text = (await resp.text())[:300]
                if 200 <= resp.status < 300:
                    return Outcome("succeeded", message=f"webhook answered {resp.status}")
                return Outcome("failed", "webhook-refused", f"HTTP {resp.status}: {text}")
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            return Outcome("failed", "webhook-unreachable", str(exc) or type(exc).__name__)


def reboot_executor(settings: RebootExecutorSettings) -> RebootExecutor:
    if settings.executor == "command":
        return CommandReboot(settings)
    if settings.executor == "webhook":
        return WebhookReboot(settings)
    return NoReboot()
