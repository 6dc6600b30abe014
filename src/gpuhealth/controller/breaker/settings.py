"""Settings of the circuit breaker (the ``breaker:`` section)."""

from __future__ import annotations

import msgspec

from gpuhealth.common.config import (
    Count,
    LabelValue,
    PositiveSeconds,
    Ratio,
    SettingError,
    Settings,
)
from gpuhealth.controller.breaker.store import MAX_WINDOW


class PoolBudget(Settings, frozen=True, kw_only=True):
    """One node pool's own breaker budget (``breaker.pools.<pool>``); a field left out is the
    fleet-wide one's."""

    max_fraction: Ratio | None = None
    """Most of the pool's GPU nodes newly tainted within ``window_s``."""
    min_nodes: Count | None = None
    """New taints always allowed in the pool in a window, whatever its size."""

    def check(self) -> None:
        if self.min_nodes is not None and self.min_nodes > MAX_WINDOW:
            raise SettingError("min_nodes", f"at most {MAX_WINDOW:,}")


class BreakerSettings(Settings, frozen=True, kw_only=True):
    enabled: bool = True
    """Off: every new hard taint is allowed (no storm protection)."""
    max_fraction: Ratio = 0.10
    """Most GPU nodes that may be newly tainted (NoSchedule/NoExecute) within ``window_s``;
    whatever the fraction, at most 2,745 nodes (the most window entries the breaker's
    ConfigMap holds, ``controller/breaker/store.py``)."""
    window_s: PositiveSeconds = 600.0
    """The sliding window ``max_fraction`` counts new taints in."""
    min_nodes: Count = 1
    """New taints always allowed in a window, whatever the fleet size (a 5-node fleet can
    still taint one node); at most 2,745 (what the ConfigMap holds)."""
    configmap: str = "gpuhealth-breaker"
    """ConfigMap (in the leader's namespace) that keeps the open/closed state and the window
    of recently disrupted nodes across restarts and leader changes; an operator may close the
    breaker by setting ``data.state: closed`` there."""
    sync_interval_s: PositiveSeconds = 1.0
    """How soon a trip, a reset or a newly counted node is written to the ConfigMap."""
    poll_interval_s: PositiveSeconds = 10.0
    """While open, how often the ConfigMap is read for an operator's reset."""
    load_backoff_s: PositiveSeconds = 1.0
    """A new leader reads the ConfigMap before any leader work starts; a read that fails
    (403, 5xx, a timeout) is tried again after this, doubling per failure up to
    ``load_backoff_max_s``. Meanwhile ``/readyz`` is 503, no hard write is allowed and
    nothing is written to the ConfigMap (a 404 is a successful read: nothing stored yet)."""
    load_backoff_max_s: PositiveSeconds = 30.0
    """Longest wait between two failed reads of the ConfigMap by a new leader."""
    per_pool: bool = True
    """Every node pool (``fleet.pool_labels``) also gets a budget of its own, besides the
    fleet-wide one: ``max(min_nodes, floor(max_fraction x the pool's GPU nodes))`` unless
    ``pools`` says otherwise. A hard write passes only when the fleet-wide budget and its
    pool's both have room; a pool that runs out opens its own breaker (its nodes' hard writes
    wait for an operator's reset, the other pools go on). Nodes in no pool (``""``) have only
    the fleet-wide budget. Off: only the fleet-wide budget."""
    pools: dict[LabelValue, PoolBudget] = msgspec.field(default_factory=dict)
    """Budgets of named pools that differ from the fleet-wide fraction and minimum, e.g.
    ``{a100-spot: {max_fraction: 0.25, min_nodes: 2}}``."""

    def check(self) -> None:
        if self.min_nodes > MAX_WINDOW:
            raise SettingError(
                "min_nodes",
                f"at most {MAX_WINDOW}: the breaker's ConfigMap (1 MiB) holds at most that many "
                "window entries, and the stored window must hold the whole budget",
            )
        if "" in self.pools:
            raise SettingError("pools", 'pool "" (nodes in no pool) has only the fleet budget')
        if self.load_backoff_max_s < self.load_backoff_s:
            raise SettingError("load_backoff_max_s", "must be at least load_backoff_s")
