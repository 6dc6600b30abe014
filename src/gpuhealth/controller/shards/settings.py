"""Settings of the shards (the ``shards:`` section; docs/architecture.md "Past one process")."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from gpuhealth.common.config import PositiveInt, PositiveSeconds, Settings
from gpuhealth.protocol.shards import MAX_SHARDS


class ShardSettings(Settings, frozen=True, kw_only=True):
    count: Annotated[int, Meta(ge=1, le=MAX_SHARDS)] = 1
    """``S``: how many shards the fleet is cut into (fixed per release; 1: one process holds
    the fleet, as without shards)."""
    replicas: Annotated[int, Meta(ge=1, le=MAX_SHARDS + 1)] = 1
    """The controller replicas of the release (the chart's ``controller.replicas``): each asks
    for up to ``ceil(count / replicas)`` free shards at once."""
    takeover_after_s: PositiveSeconds = 30.0
    """A shard free for this long (its owner released it or stopped renewing its Lease, and
    no replica under its fair share took it) is taken by any replica, over its share: a spare,
    or one covering for a lost replica."""
    lookup_ttl_s: PositiveSeconds = 30.0
    """How long a replica keeps the shard a Node's label names, read on the API server for an
    agent it turns away (``Gpuhealth-Shard``: where that agent should go instead)."""
    lookup_max_concurrent: PositiveInt = 8
    """Most such reads at once (the door is open before the token review: beyond this the
    503 names no shard)."""
    peer_address_ttl_s: PositiveSeconds = 5.0
    """How long a shard owner's address, read from its per-shard EndpointSlice
    (``<leader.service>-shard-<i>-leader``), is used before it is read again (also an owner
    found missing; a peer that did not answer is read again at once)."""
    peer_connect_timeout_s: PositiveSeconds = 2.0
    """Deadline to connect to a shard's owner when a merged read asks it for its shards."""
    peer_request_timeout_s: PositiveSeconds = 10.0
    """Deadline of one request to a shard's owner (connect included); past it the shard is
    ``unavailable`` in the merged answer."""
    peer_ca_file: str = ""
    """The CA the other replicas' certificates are verified with when this replica serves TLS
    (the chart mounts the CA it publishes); empty: the system's trust store."""
    handoff_queue_max: PositiveInt = 10_000
    """Reports of jobs homed in another replica's shard waiting to be sent to it (a job is
    decided by its home shard's owner, ``controller/incidents/job_home.py``); beyond this a
    new one is dropped (``gpuhealth_shard_handoffs_total{result="dropped"}``)."""
    handoff_batch_max: PositiveInt = 500
    """Most reports (or attempt sets) in one POST to another owner (each body also within
    ``http.max_body_bytes``)."""
    handoff_backoff_s: PositiveSeconds = 0.5
    """Wait after a handoff to another owner failed (no owner published, refused, no
    answer), doubled at each failure in a row up to ``handoff_backoff_max_s``; what failed
    stays queued."""
    handoff_backoff_max_s: PositiveSeconds = 30.0
    """The longest wait between two tries of a failing handoff."""
    handoff_resend_s: PositiveSeconds = 60.0
    """A job's attempts that first faulted on another owner's nodes are sent to it when they
    change, and again after this long unchanged (an owner that took the shard over since has
    none)."""
