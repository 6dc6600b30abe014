"""Settings of the shards (the ``shards:`` section; docs/architecture.md "Past one process")."""

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
    rescope_settle_s: NonNegative = 1.0
    """After a change of the shards a replica owns, how long it waits for more before it
    scopes its node watch and starts its work again for the new set (its Leases are won one
    at a time: one relist for the lot). A shard lost stops its writes at once regardless."""
    sizes_configmap: str = "gpuhealth-shards"
    """ConfigMap in the controller's namespace (``leader.namespace``) where the singleton keeps
    the shards' sizes: ``data.count`` (``count``) and ``data.sizes`` (a JSON list: the GPU
    nodes of each shard), from which each owner takes its part of the fleet-wide budgets
    (the breaker's ``min_nodes``, remediation's caps). Written only when the sizes change."""
    sizes_interval_s: PositiveSeconds = 10.0
    """How often, at most, the singleton compares the shards' sizes with the ConfigMap and
    writes them when they changed (a quiet fleet writes nothing)."""
    sizes_poll_interval_s: PositiveSeconds = 10.0
    """How often a shard owner reads the sizes ConfigMap again."""
    label_concurrency: Annotated[int, Meta(ge=1, le=64)] = 8
    """Node label writes the singleton has in flight at once (a new release labels every
    Node of the cluster once)."""
    label_backoff_s: PositiveSeconds = 0.5
    """A Node label write that failed (5xx, 429, a timeout, 403) is tried again after this,
    doubling per failure of that Node up to ``label_backoff_max_s``."""
    label_backoff_max_s: PositiveSeconds = 60.0
    """Longest wait before a failing Node label write is tried again."""

    def check(self) -> None:
        if self.label_backoff_max_s < self.label_backoff_s:
            raise SettingError("label_backoff_max_s", "must be at least label_backoff_s")

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
