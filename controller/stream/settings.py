"""Named, documented settings of the controller's stream server."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StreamServerSettings:
    audience: str = "gpuhealth"
    """TokenReview audience the agent's projected token must carry."""
    agent_namespace: str = "gpuhealth"
    agent_service_account: str = "gpuhealth-agent"
    """Only this ServiceAccount may speak for a node."""
    hello_timeout_s: float = 10.0
    """A connection that does not send Hello within this time is closed."""
    rate_per_s: float = 50.0
    """Sustained messages per second per connection (token bucket refill rate)."""
    rate_burst: float = 2_000.0
    """Bucket size: a reconnecting agent replays its backlog in bursts of up to this many."""
    ws_ping_interval_s: float = 30.0
    """WebSocket ping interval; an agent that misses a pong is disconnected."""
    auth_cache_ttl_s: float = 60.0
    """How long a positive TokenReview is reused (keyed by the token's SHA-256). A deleted
    pod's token therefore stays accepted for at most this long on reconnects."""
    auth_cache_max_entries: int = 20_000
    """Bound on cached reviews; the oldest entry is evicted first."""
    close_timeout_s: float = 2.0
