"""The dcgm-exporter source's settings: the ``dcgm:`` section."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from gpuhealth.common.config import PositiveSeconds, Settings


class DcgmSettings(Settings, frozen=True, kw_only=True):
    scrape_interval_s: PositiveSeconds = 15.0
    """dcgm-exporter collects every 30 s by default; scraping much faster adds nothing."""
    timeout_s: PositiveSeconds = 5.0
    """One scrape, connect to last byte."""
    max_body_bytes: Annotated[int, Meta(ge=1024)] = 16 * 1024 * 1024
    """A larger response is refused (a broken or hostile endpoint)."""
