"""The agent's ``remediation`` settings section (off by default)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from gpuhealth.common.config import PositiveInt, PositiveSeconds, Seconds, SettingError, Settings

Argv = Annotated[tuple[str, ...], Meta(min_length=1, max_length=64)]


class ResetCommandSettings(Settings, frozen=True, kw_only=True):
    command: Argv = ("nvidia-smi", "--gpu-reset", "-i", "{uuid}")
    """Resets one GPU; ``{uuid}`` is replaced by its UUID. Runs only after NVML says no
    process uses the GPU."""
    timeout_s: PositiveSeconds = 120.0
    """A reset command still running after this is killed and the reset reported failed."""


class RebootExecutorSettings(Settings, frozen=True, kw_only=True):
    executor: Literal["none", "command", "webhook"] = "none"
    """``none``: reboot orders are refused (``no-executor``). ``command``: run ``command`` on
    the node. ``webhook``: POST the order to ``webhook_url`` (a cloud or BMC integration)."""
    command: Argv = ("systemctl", "reboot")
    """With ``executor: command`` (the agent needs the host's PID namespace and privileges,
    e.g. ``nsenter -t 1 -m -u -i -n -p -- systemctl reboot``)."""
    webhook_url: str = ""
    """With ``executor: webhook``: the http(s) URL the reboot order is POSTed to."""
    webhook_token_file: str | None = None
    """A bearer token for the webhook, read at each request (rotation-friendly)."""
    timeout_s: PositiveSeconds = 30.0
    """How long the command or the webhook may take to accept the reboot."""
    delay_s: Seconds = 2.0
    """Pause between reporting ``accepted`` and rebooting, so the report leaves the node."""

    def check(self) -> None:
        if self.executor == "webhook" and not self.webhook_url.startswith(("https://", "http://")):
            raise SettingError("webhook_url", "an http(s) URL is needed with executor: webhook")


class ValidationCheckSettings(Settings, frozen=True, kw_only=True):
    check_interval_s: PositiveSeconds = 5.0
    """How often the GPUs' health is looked at during the soak window."""
    nvml_timeout_s: PositiveSeconds = 10.0
    """Deadline of one NVML probe (a hung GPU must not hang the validation)."""
    diagnostic_command: Argv = ("dcgmi", "diag", "-r", "1")
    """The diagnostic hook, run when an order asks for it; a program that is not installed
    fails the validation (``diagnostic-unavailable``), it never passes it."""
    diagnostic_timeout_s: PositiveSeconds = 900.0
    """A diagnostic hook still running after this is killed and the validation fails."""


class AgentRemediationSettings(Settings, frozen=True, kw_only=True):
    enabled: bool = False
    """Accept remediation orders from the controller (off: every order is refused)."""
    reset: ResetCommandSettings = msgspec.field(default_factory=ResetCommandSettings)
    reboot: RebootExecutorSettings = msgspec.field(default_factory=RebootExecutorSettings)
    validation: ValidationCheckSettings = msgspec.field(default_factory=ValidationCheckSettings)
    allow_plaintext_orders: bool = False
    """Execute orders that arrive on a plaintext stream (``ws://``). Off: every order on a
    stream that is not TLS (``wss://``, the controller's certificate verified) is refused
    (``plaintext-stream``, counted in ``gpuhealth_agent_orders_refused_total``): a GPU reset
    or a reboot must not be something anyone on the network path can inject. On for tests and
    demos on one machine only, as the controller's own ``allow_plaintext_orders``."""
    journal_size: PositiveInt = 64
    """Results of this many recent orders are kept on disk (a repeated order id gets the
    result it already had, also after an agent restart)."""
