"""Named, documented settings of the agent's stream client (defaults are production values).

The ``stream:`` section of the agent configuration (``backoff`` and ``outbox`` nested in it).
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from gpuhealth.common.config import (
    PositiveInt,
    PositiveSeconds,
    Ratio,
    SettingError,
    Settings,
)


class BackoffSettings(Settings, frozen=True, kw_only=True):
    """Reconnect delay: ``initial_s * factor**(attempt-1)`` capped at ``max_s``, full jitter
    of ``jitter`` (fraction) around it so that a fleet does not reconnect in lock-step."""

    initial_s: PositiveSeconds = 0.5
    """First reconnect delay after a connection fails."""
    max_s: PositiveSeconds = 30.0
    """Longest reconnect delay, however many attempts failed."""
    factor: Annotated[float, Meta(ge=1.0, le=10.0)] = 2.0
    """Growth of the delay per failed attempt."""
    jitter: Ratio = 0.3
    """Random spread around each delay, as a fraction of it."""
    reset_after_s: PositiveSeconds = 30.0
    """A connection that stayed up this long resets the attempt counter."""
    retry_after_jitter: Annotated[float, Meta(ge=0.0, le=10.0)] = 0.5
    """When the controller says "come back after N s" (admission pacing), the agent waits
    N plus up to this fraction of N more, at random: never sooner than told, and agents
    told the same N do not return in lock-step. Such an answer is not a failure: the
    attempt counter does not grow."""

    def check(self) -> None:
        if self.initial_s > self.max_s:
            raise SettingError("initial_s", "must not be above max_s")


class OutboxSettings(Settings, frozen=True, kw_only=True):
    max_messages: PositiveInt = 20_000
    """Unacknowledged messages kept; beyond it the oldest heartbeat is dropped. Events are
    never dropped and may exceed the bound (as may the one pending snapshot)."""
    max_bytes: Annotated[int, Meta(ge=64 * 1024)] = 64 * 1024 * 1024
    """Same bound on the encoded size of the unacknowledged messages."""
    fsync_events: bool = True
    """With a controller, every commit of the agent's state store (the outbox's Events and
    remediation action reports, with the latched verdicts and the kernel-log position of the
    same change) is on disk before it returns (SQLite ``synchronous=FULL``): a health fact, or
    what the agent did to the node, survives a power loss and a reboot. False, or no
    controller: ``synchronous=NORMAL`` (a process crash loses nothing, a power loss the last
    commits)."""


class StreamClientSettings(Settings, frozen=True, kw_only=True):
    url: str = ""
    """The controller's stream URL (a ``{shard}`` in it is the shard dialled). The agent fills
    it from the top-level ``controller_url`` (``--controller-url``); a configuration file that
    sets it here is rejected."""
    heartbeat_interval_s: PositiveSeconds = 10.0
    """How often a Heartbeat (allocation usage + telemetry) is queued."""
    connect_timeout_s: PositiveSeconds = 10.0
    """TCP + TLS + WebSocket handshake deadline."""
    accept_timeout_s: PositiveSeconds = 60.0
    """After Hello, how long the agent waits for the controller's answer (its first Ack:
    accepted, or an Error such as "come back later"). The controller may hold a Hello while it
    admits others (its ``admission_max_wait_s``, 20 s, is shorter); nothing else is sent
    until the answer, and the Ack deadline below starts only then."""
    ack_timeout_s: PositiveSeconds = 30.0
    """A message sent but not acknowledged for this long means the connection is dead (the
    heartbeats keep something in flight, so a silent controller is noticed within about
    ``ack_timeout_s + heartbeat_interval_s``); the client reconnects. At least three heartbeat
    intervals are allowed, since the controller acknowledges heartbeats every 3rd by default
    (``heartbeat_ack_every``): the oldest waits two intervals for its Ack."""
    ws_ping_interval_s: PositiveSeconds | None = None
    """WebSocket pings from the agent; off by default: the Ack watchdog above already detects a
    dead controller, and 5,000 agents' pings would cost the controller CPU for nothing."""
    max_in_flight: PositiveInt = 1_000
    """Messages sent but not yet acknowledged before the sender waits for an Ack."""
    close_timeout_s: PositiveSeconds = 2.0
    """How long a closing WebSocket waits for the controller's close frame."""
    backoff: BackoffSettings = msgspec.field(default_factory=BackoffSettings)
    outbox: OutboxSettings = msgspec.field(default_factory=OutboxSettings)

    def check(self) -> None:
        if self.ack_timeout_s <= self.heartbeat_interval_s:
            raise SettingError(
                "ack_timeout_s",
                "must be longer than heartbeat_interval_s (the controller acknowledges "
                "heartbeats in batches)",
            )
