"""Settings of the fleet model (the ``fleet:`` section)."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from gpuhealth.common.config import LabelKey, PositiveSeconds, Settings
from gpuhealth.controller.names import DEFAULT_POOL_LABELS


class FleetSettings(Settings, frozen=True, kw_only=True):
    agent_timeout_s: PositiveSeconds = 60.0
    """An agent silent for longer than this makes its node Unknown (heartbeats come every few s)."""
    stale_check_interval_s: PositiveSeconds = 5.0
    """How often the fleet looks for agents that went silent."""
    waiting_grace_s: PositiveSeconds = 180.0
    """An agent that is waiting for its turn to be admitted (queued, or told to come back
    after a restart or failover) is quiet because of the controller, not because it is gone:
    its node is not called silent for up to this much longer than ``agent_timeout_s``. Bounded
    because a waiting Hello is not yet authenticated."""
    pool_labels: Annotated[tuple[LabelKey, ...], Meta(max_length=16)] = DEFAULT_POOL_LABELS
    """Labels naming a node's pool, tried in order (Karpenter's NodePool, EKS's node group,
    GKE's node pool, AKS's agent pool, a generic one): the first a node carries is its pool
    (``gpuhealth.controller.fleet.pools``). The circuit breaker and the remediation caps give
    each pool a budget besides the fleet-wide one; a node with none of them is in pool ``""``,
    which has only the fleet-wide budgets. Also the fleet API's ``pool`` filter."""
