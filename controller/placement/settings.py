"""Settings of the scheduler extender (the ``extender:`` section of the controller config)."""

from __future__ import annotations

import msgspec


class ExtenderSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    enabled: bool = True
    resource: str = "nvidia.com/gpu"
    """The extended resource whose request the filter checks (``managedResources`` too)."""
    unknown_node_score: int = 5
    """Score of a node without a reporting agent: the middle of 0..10, so such a node is
    neither dropped nor preferred over a degraded one; known-healthy nodes score 6..10."""
    thermal_full_headroom_c: float = 30.0
    """Degrees below the slowdown threshold that earn the full thermal score."""
    sbe_half_score: float = 10.0
    """Recent correctable (single-bit) ECC errors on a node that halve its ECC score."""
    thermal_weight: float = 0.5
    ecc_weight: float = 0.3
    bandwidth_weight: float = 0.2
    """Relative weights of the quality terms; a term no GPU reports is left out and the
    others are re-weighted, so missing telemetry neither helps nor hurts."""
    max_body_bytes: int = 32 << 20
    """Largest request body accepted (5,000 full Node objects fit well within 32 MiB)."""

    def __post_init__(self) -> None:
        if not 0 <= self.unknown_node_score <= 10:
            raise ValueError("extender.unknown_node_score must be within 0..10")
        if self.thermal_full_headroom_c <= 0 or self.sbe_half_score <= 0:
            raise ValueError("extender.thermal_full_headroom_c and sbe_half_score must be > 0")
        if min(self.thermal_weight, self.ecc_weight, self.bandwidth_weight) < 0:
            raise ValueError("extender weights must be >= 0")
