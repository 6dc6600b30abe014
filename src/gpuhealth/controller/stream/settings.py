"""Named, documented settings of the controller's stream server (the ``stream:`` section)."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from gpuhealth.common.config import (
    NonNegative,
    PositiveInt,
    PositiveSeconds,
    SettingError,
    Settings,
)


class StreamServerSettings(Settings, frozen=True, kw_only=True):
    audience: str = "gpuhealth"
    """TokenReview audience the agent's projected token must carry."""
    agent_namespace: str = "gpuhealth"
    """Namespace of the agent ServiceAccount (with ``agent_service_account``)."""
    agent_service_account: str = "gpuhealth-agent"
    """Only this ServiceAccount may speak for a node."""
    hello_timeout_s: PositiveSeconds = 10.0
    """A connection that does not send Hello within this time is closed."""
    rate_per_s: NonNegative = 200.0
    """Sustained messages per second per connection (token bucket refill rate)."""
    rate_burst: Annotated[float, Meta(ge=1.0)] = 25_000.0
    """Bucket size. Above the agent outbox's ``max_messages`` (20,000) so that a reconnecting
    agent can replay a full backlog at once; a peer over the limit gets RATE_LIMITED."""
    heartbeat_ack_every: Annotated[int, Meta(ge=1, le=100)] = 3
    """Acknowledge every N-th consecutive Heartbeat (Events and Snapshots at once). An Ack is
    the controller's costliest step per Heartbeat (one socket send): every 3rd sends a third
    as many. The agent's Ack watchdog (``ack_timeout_s``, 30 s, at least three heartbeat
    intervals) must exceed ``(N - 1) x heartbeat_interval_s`` (20 s at 10 s)."""
    unread_max_bytes: Annotated[int, Meta(ge=0, le=64 * 1024 * 1024)] = 65_536
    """Acknowledgements are written without waiting for the agent to take them (where its
    frames are parsed, ``stream/agent_socket.py``); once this much written to a connection
    sits unread in the controller's buffer, the agent is not reading and its stream ends
    (``rate-limited``) instead of the buffer growing. 64 KiB: thousands of Acks."""
    ws_ping_interval_s: PositiveSeconds | None = None
    """WebSocket pings: every interval, one to each accepted agent that sent nothing since the
    last round; an agent that answered nothing by the next round is disconnected (task
    ``stream-pings``). An agent that sends Heartbeats is never pinged. Off by default: the
    kernel's TCP keepalive (``http.tcp_keepalive_*``) reaps half-open connections without
    waking the controller, and a silent agent is detected by the fleet from its missing
    Heartbeats."""
    auth_cache_ttl_s: Annotated[float, Meta(ge=0.0, le=10.0)] = 10.0
    """How long a positive TokenReview is reused (keyed by the token's SHA-256); at most the
    API server's own token cache (10 s). A review is dropped at once when its pod is gone
    (the agent-pod watch), so this only bounds how long other changes take to be seen."""
    auth_cache_max_entries: PositiveInt = 20_000
    """Bound on cached reviews; the oldest entry is evicted first."""
    auth_max_concurrent_reviews: Annotated[int, Meta(ge=1, le=1024)] = 32
    """TokenReviews in flight at once (a reconnect storm queues here, not on the API server)."""
    auth_local_trust_s: Annotated[float, Meta(ge=0.0, le=60.0)] = 10.0
    """Agents' bound tokens are verified by the controller itself (the issuer's published
    keys, the agent-pod watch) instead of a TokenReview each, while a TokenReview within this
    time confirmed the agent ServiceAccount's UID; every token it cannot decide still goes to
    the API server. 0: every token reviewed by the API server. Needs ``watch_agent_pods``."""
    auth_issuer_keys_max_age_s: PositiveSeconds = 60.0
    """The issuer's keys are fetched again once older than this (a key the API server no
    longer publishes stops being trusted within it)."""
    auth_issuer_keys_refetch_s: PositiveSeconds = 5.0
    """Shortest time between two fetches of the issuer's keys prompted by a token signed
    with a key ID not among them, or after a fetch that failed."""
    auth_failed_reviews_burst: Annotated[int, Meta(ge=1, le=100_000)] = 10
    """Tokens that did not validate that one client address may present in a row; then its
    connections are refused RATE_LIMITED without a TokenReview (refusals are never cached,
    so each forged token would cost the API server one) until one is forgiven."""
    auth_failed_reviews_per_s: Annotated[float, Meta(gt=0.0, le=1000.0)] = 1.0
    """How fast failed reviews are forgiven per address. Valid tokens are never charged."""
    watch_agent_pods: bool = True
    """Watch the agent pods (``agent_namespace``, ``agent_service_account``) and refuse and
    cut a stream whose token's pod is gone (deleted, terminating, replaced). Off only for
    tests without pods."""
    close_max_concurrent: Annotated[int, Meta(ge=1, le=100_000)] = 256
    """Agent connections closed at once when the controller shuts down: closing 19,000 at
    once held the event loop for seconds, past the Lease's renew deadline."""
    close_timeout_s: PositiveSeconds = 2.0
    """How long closing a WebSocket waits for the agent's close frame."""
    order_send_timeout_s: PositiveSeconds = 5.0
    """How long writing a remediation order to an agent's stream may take; an order not
    written in time counts as undelivered and the episode sends it again later."""
    admission_max_concurrent: Annotated[int, Meta(ge=1, le=4096)] = 64
    """Agent handshakes (token review, pod check, accept) run at once; after a restart or a
    failover the rest wait for a turn (``admission_max_waiting``) or are told to come back."""
    admission_max_waiting: Annotated[int, Meta(ge=0, le=100_000)] = 1_000
    """Handshakes that wait for a turn, their sockets held open (bounds the controller's memory
    in a reconnect storm); beyond it (connections upgraded but whose Hello is not queued yet
    counted too) an agent is turned away at once, before the WebSocket upgrade: HTTP 503 with
    ``Retry-After``."""
    admission_max_wait_s: PositiveSeconds = 20.0
    """Longest wait for a turn; then the agent is told to come back. Below the agent's
    ``accept_timeout_s`` (60 s), so the controller answers before the agent gives up."""
    admission_retry_after_min_s: PositiveSeconds = 1.0
    """Shortest come-back delay told to an agent (also when this replica shuts down)."""
    not_owner_retry_after_s: Annotated[float, Meta(gt=0.0, le=600.0)] = 5.0
    """Past one process: how long an agent of a shard this replica does not own is told to
    wait before it asks its shard's Service again (that Service's endpoint moves with the
    shard's Lease, within a lease duration)."""
    admission_retry_after_max_s: Annotated[float, Meta(gt=0.0, le=3600.0)] = 300.0
    """Longest come-back delay told to an agent, however long the backlog (the agent adds
    its jitter on top). Every agent whose turn lies beyond it is told this same delay and they
    return together: at 120 s, 19,000 agents reconnecting were told 96 s alike and came back
    as a second storm (bench ``fleet_scale``), so it sits above a large fleet's cold start."""
    admission_initial_handshake_s: PositiveSeconds = 0.05
    """The handshake time assumed until some are measured (it sets the expected admission
    rate, ``admission_max_concurrent`` / handshake time, from which come-back delays are
    spread)."""

    def check(self) -> None:
        if self.admission_retry_after_min_s > self.admission_retry_after_max_s:
            raise SettingError(
                "admission_retry_after_min_s", "must not be above admission_retry_after_max_s"
            )
