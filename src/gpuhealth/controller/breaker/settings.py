"""Settings of the circuit breaker (the ``breaker:`` section)."""

from __future__ import annotations

from gpuhealth.common.config import (
    Count,
    PositiveSeconds,
    Ratio,
    Settings,
)


class BreakerSettings(Settings, frozen=True, kw_only=True):
    enabled: bool = True
    """Off: every new hard taint is allowed (no storm protection)."""
    max_fraction: Ratio = 0.10
    """Most GPU nodes that may be newly tainted (NoSchedule/NoExecute) within ``window_s``."""
    window_s: PositiveSeconds = 600.0
    """The sliding window ``max_fraction`` counts new taints in."""
    min_nodes: Count = 1
    """New taints always allowed in a window, whatever the fleet size (a 5-node fleet can
    still taint one node)."""
    configmap: str = "gpuhealth-breaker"
    """ConfigMap (in the leader's namespace) that keeps the open/closed state and the window
    of recently disrupted nodes across restarts and leader changes; an operator may close the
    breaker by setting ``data.state: closed`` there."""
    sync_interval_s: PositiveSeconds = 1.0
    """How soon a trip, a reset or a newly counted node is written to the ConfigMap."""
    poll_interval_s: PositiveSeconds = 10.0
    """While open, how often the ConfigMap is read for an operator's reset."""
