"""The ``idle:`` section of the controller configuration: thresholds, windows, per-namespace
overrides, cadence and bounds of idle-allocation detection."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from gpuhealth.common.config import PositiveInt, PositiveSeconds, Ratio, Settings
from gpuhealth.controller.names import Keys

DEFAULT_THRESHOLD_RATIO = 0.05
DEFAULT_WINDOW_S = 1800.0
DEFAULT_MAX_GAP_S = 300.0


class NamespaceIdleSettings(Settings, frozen=True, kw_only=True):
    """A per-namespace override; unset fields inherit the defaults."""

    threshold_ratio: Ratio | None = None
    """This namespace's ``idle.threshold_ratio``; None = the default."""
    window_s: PositiveSeconds | None = None
    """This namespace's ``idle.window_s``; None = the default."""
    exempt: bool = False
    """Never flag this namespace's pods idle."""


class IdleSettings(Settings, frozen=True, kw_only=True):
    """The ``idle:`` section of the controller configuration file."""

    enabled: bool = True
    """Track GPU allocations and flag the idle ones."""
    threshold_ratio: Ratio = DEFAULT_THRESHOLD_RATIO
    """Utilisation strictly below this (0..1) counts as idle."""
    window_s: PositiveSeconds = DEFAULT_WINDOW_S
    """How long utilisation must stay under the threshold, and the minimum time running."""
    max_gap_s: PositiveSeconds = DEFAULT_MAX_GAP_S
    """Longest silence between two reports that still counts as continuous evidence."""
    exempt_namespaces: list[str] = msgspec.field(default_factory=lambda: ["kube-system"])
    """Pods in these namespaces are never flagged idle."""
    namespaces: dict[str, NamespaceIdleSettings] = msgspec.field(default_factory=dict)
    """Per-namespace overrides of ``threshold_ratio``, ``window_s`` and exemption."""
    evaluate_interval_s: PositiveSeconds = 30.0
    """How often the tracker evaluates every allocation and refreshes the metrics."""
    stale_after_s: PositiveSeconds = 600.0
    """An allocation no heartbeat has carried for this long is forgotten (pod gone, agent gone)."""
    max_allocations: PositiveInt = 200_000
    """Hard cap on tracked allocations (bounded memory); new ones beyond it are dropped."""
    annotate: bool = False
    """Also set the pod annotation ``<prefix>/idle-since`` while idle (removed when busy)."""
    annotation_key: str = Keys().idle_annotation
    """The pod annotation ``annotate`` writes."""
    emit_events: bool = True
    """Write an Event ``GPUIdle`` on the Pod once per window of idleness."""
    max_pending_writes: Annotated[int, Meta(ge=0)] = 1000
    """Pod writes (Events, annotations) queued per evaluation; the oldest beyond are dropped."""
