"""Settings of ``gpuhealth-controller cleanup`` (the ``cleanup:`` section)."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from gpuhealth.common.config import (
    PositiveSeconds,
    Settings,
)


class CleanupSettings(Settings, frozen=True, kw_only=True):
    """``gpuhealth-controller cleanup`` (the chart's pre-delete hook): removing what the
    controller wrote before it is uninstalled (controller/cleanup/steps.py)."""

    stop_timeout_s: PositiveSeconds = 120.0
    """How long cleanup waits for the controller to stop (its pods gone, its Lease given up
    or expired) before it fails without touching anything."""
    poll_interval_s: PositiveSeconds = 1.0
    """How often cleanup looks again while it waits for the controller to stop."""
    request_timeout_s: PositiveSeconds = 10.0
    """Deadline of one API request."""
    conflict_retries: Annotated[int, Meta(ge=1, le=100)] = 5
    """A Node that changed under a write (409) is read and planned again this many times."""
    page_size: Annotated[int, Meta(ge=1, le=5000)] = 500
    """Objects per list request (Nodes, Pods)."""
