"""Settings of the fleet model (the ``fleet:`` section)."""

from __future__ import annotations

from gpuhealth.common.config import (
    PositiveSeconds,
    Settings,
)


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
