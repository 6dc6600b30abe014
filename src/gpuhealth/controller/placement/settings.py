"""Settings of the scheduler extender (the ``extender:`` section of the controller config)."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from gpuhealth.common.config import NonNegative, Settings

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
    max_body_bytes: Annotated[int, Meta(ge=1024, le=1 << 30)] = 32 << 20
    """Largest request body accepted (5,000 full Node objects fit well within 32 MiB)."""
