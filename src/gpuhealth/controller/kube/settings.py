"""The ``watch:`` section: how every watch-fed cache lists and watches
(:mod:`gpuhealth.controller.kube.informer`)."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from gpuhealth.common.config import Seconds, Settings


class WatchSettings(Settings, frozen=True, kw_only=True):
    timeout_s: Annotated[int, Meta(ge=1, le=3600)] = 300
    """Server-side watch timeout; the watch is resumed from the last resourceVersion."""
    list_page_size: Annotated[int, Meta(ge=0, le=100_000)] = 500
    """Objects per page of a LIST (``limit``; 0 = the whole collection in one answer). The
    controller applies each page as it arrives, so the event loop is never held by a whole
    fleet's Nodes at once; 500 is client-go's page."""
    relist_backoff_s: Seconds = 1.0
    """First pause after a watch error before the watch resumes or relists (410 Gone relists
    at once)."""
    relist_backoff_max_s: Seconds = 30.0
    """Longest pause after consecutive watch errors: the pause doubles per failure from
    ``relist_backoff_s`` up to this; a successful list or watch event starts again."""
