"""Named, documented settings of the agent's stream client (defaults are production values)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class BackoffSettings:
    """Reconnect delay: ``initial_s * factor**(attempt-1)`` capped at ``max_s``, full jitter
    of ``jitter`` (fraction) around it so that a fleet does not reconnect in lock-step."""

    initial_s: float = 0.5
    max_s: float = 30.0
    factor: float = 2.0
    jitter: float = 0.3
    reset_after_s: float = 30.0
    """A connection that stayed up this long resets the attempt counter."""


@dataclass(frozen=True, slots=True)
class OutboxSettings:
    max_messages: int = 20_000
    """Unacknowledged messages kept; beyond it the oldest heartbeat is dropped. Events are
    never dropped and may exceed the bound (as may the one pending snapshot)."""
    max_bytes: int = 64 * 1024 * 1024
    """Same bound on the encoded size of the unacknowledged messages."""
    fsync_events: bool = True
    """fsync after appending an Event (a health fact must survive a power loss). Heartbeats,
    snapshots and ack records are written without fsync: after a crash they are either in the
    page cache (process crash) or harmless to lose (power loss: duplicates are deduped by the
    controller, a lost heartbeat is superseded by the next)."""
    compact_min_dead: int = 1_000
    """Rewrite the log once it holds at least this many dead records and more dead than live."""


@dataclass(frozen=True, slots=True)
class StreamClientSettings:
    url: str = "ws://127.0.0.1:8080/v1/stream"
    heartbeat_interval_s: float = 10.0
    """How often a Heartbeat (allocation usage + telemetry) is queued."""
    connect_timeout_s: float = 10.0
    """TCP + TLS + WebSocket handshake deadline."""
    ack_timeout_s: float = 30.0
    """A message sent but not acknowledged for this long means the connection is dead (the
    heartbeats keep something in flight, so a silent controller is noticed within about
    ``ack_timeout_s + heartbeat_interval_s``); the client reconnects. At least three heartbeat
    intervals are allowed, since the controller acknowledges heartbeats every 2nd by default."""
    ws_ping_interval_s: float | None = None
    """WebSocket pings from the agent; off by default: the Ack watchdog above already detects a
    dead controller, and 5,000 agents' pings would cost the controller CPU for nothing."""
    max_in_flight: int = 1_000
    """Messages sent but not yet acknowledged before the sender waits for an Ack."""
    close_timeout_s: float = 2.0
    backoff: BackoffSettings = field(default_factory=BackoffSettings)
    outbox: OutboxSettings = field(default_factory=OutboxSettings)
