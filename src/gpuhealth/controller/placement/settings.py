"""Settings of the scheduler extender (the ``extender:`` section of the controller config)."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from gpuhealth.common.config import NonNegative, SettingError, Settings

Positive = Annotated[float, Meta(gt=0.0)]


class ExtenderSettings(Settings, frozen=True, kw_only=True):
    enabled: bool = True
    """Serve the scheduler extender's filter and prioritize endpoints."""
    resource: str = "nvidia.com/gpu"
    """The extended resource whose request the filter checks (``managedResources`` too)."""
    unknown_node_score: Annotated[int, Meta(ge=0, le=10)] = 5
    """Score of a node without a reporting agent: the middle of 0..10, so such a node is
    neither dropped nor preferred over a degraded one; known-healthy nodes score 6..10."""
    thermal_full_headroom_c: Positive = 30.0
    """Degrees below the slowdown threshold that earn the full thermal score."""
    sbe_half_score: Positive = 10.0
    """Recent correctable (single-bit) ECC errors on a node that halve its ECC score."""
    thermal_weight: NonNegative = 0.5
    """Weight of thermal headroom in the score (see ``bandwidth_weight``)."""
    ecc_weight: NonNegative = 0.3
    """Weight of recent correctable ECC errors in the score (see ``bandwidth_weight``)."""
    bandwidth_weight: NonNegative = 0.2
    """Relative weights of the quality terms; a term no GPU reports is left out and the
    others are re-weighted, so missing telemetry neither helps nor hurts."""
    max_body_bytes: Annotated[int, Meta(ge=1024, le=1 << 30)] = 4 << 20
    """Largest request body accepted, read before any authentication (within
    ``http.body_timeout_s``, at most ``http.max_concurrent_body_reads`` at once); larger gets
    413. kube-scheduler with ``nodeCacheCapable: true`` (the shipped configuration) sends the
    pod and the node names: ~100 KB for 5,000 nodes; 4 MiB holds the largest pod etcd
    stores (1.5 MiB) with 20,000 names. ``nodeCacheCapable: false`` sends whole Node objects
    (tens of MiB at a few thousand nodes): raise it then."""
    client_ca_file: str | None = None
    """A PEM CA bundle: when set, the extender's routes answer only callers that present a
    client certificate it signed (kube-scheduler's ``extenders[].tlsConfig`` ``certFile`` /
    ``keyFile``, deploy/scheduler); others get 401 before their body is read
    (``gpuhealth_extender_requests_total{result="unauthenticated"}``). Needs TLS
    (``--tls-cert-file``); agents and people need no certificate on the same port."""
    peer_summary_max_age_s: Positive = 5.0
    """Past one process: the oldest score of another shard's node prioritize uses (fetched
    from its owner); older, or never fetched, the node gets ``unknown_node_score``."""
    peer_summary_refresh_s: Positive = 2.0
    """Past one process: how often the other shards' owners are asked for their scores
    (below ``peer_summary_max_age_s``, so that one missed answer leaves the scores in use)."""

    def check(self) -> None:
        if self.peer_summary_refresh_s >= self.peer_summary_max_age_s:
            raise SettingError("peer_summary_refresh_s", "must be below peer_summary_max_age_s")
