"""The settings of the sources: the ``nvml:``, ``kmsg:`` and ``dcgm:`` sections."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from gpuhealth.common.config import (
    PositiveInt,
    PositiveSeconds,
    Seconds,
    SettingError,
    Settings,
)


class NvmlSettings(Settings, frozen=True, kw_only=True):
    poll_interval_s: PositiveSeconds = 1.0
    """Time between polls of every GPU (tools keep >= 1 s: NVML calls are not free)."""
    call_deadline_s: PositiveSeconds = 2.0
    """One GPU's whole sample read must finish within this; otherwise it is unresponsive."""
    init_deadline_s: PositiveSeconds = 60.0
    """nvmlInit and the inventory (slow without persistence mode)."""
    expected_gpus: Annotated[int, Meta(ge=0, le=64)] | None = None
    """GPUs the node should have; ``None``: as many as found at start."""
    event_wait_ms: Annotated[int, Meta(ge=1, le=60_000)] = 500
    """One nvmlEventSetWait; also how quickly the waiter notices shutdown."""
    nvlink_every_polls: PositiveInt = 5
    """NVLink state and error counters (about 90 calls per GPU) are read every Nth poll."""
    process_utilization: bool = True
    """Read per-process SM utilisation (for idle-allocation attribution)."""
    mig_recheck_s: PositiveSeconds = 60.0
    """A GPU whose MIG mode answered NOT_SUPPORTED is asked again this often (a mode change
    pending a reset may answer it); any change of mode re-probes every NOT_SUPPORTED call."""
    operational_events: bool = True
    """Subscribe to GPU Operational Events (drivers R615+, preview) where the driver offers
    them; older drivers keep the legacy paths (docs/operations.md)."""
    operational_events_recheck_s: PositiveSeconds = 300.0
    """A driver that did not offer operational events is asked again this often (a driver
    upgraded or reloaded under a running agent); also the longest pause before an event set
    whose waits keep failing is made anew."""
    cper_replay: bool = True
    """At start, read the GPUs' CPER records (nvmlSystemGetCPER_v1, root only) and report
    those not handled before (what happened while the agent was down)."""
    shutdown_deadline_s: PositiveSeconds = 2.0
    """At stop: how long the NVML threads may take to finish and nvmlShutdown to return (it
    runs in the NVML system thread, never on the event loop). Past it the agent stops anyway;
    keep it below the agent's ``shutdown_timeout_s``."""


class KmsgSettings(Settings, frozen=True, kw_only=True):
    file_poll_interval_s: PositiveSeconds = 0.01
    """A regular file without inotify: the first re-check after lines arrived (tail -F); each
    quiet check doubles the wait, up to ``file_poll_max_s``."""
    file_poll_max_s: PositiveSeconds = 1.0
    """A regular file: the longest wait between two checks of a quiet file (with inotify, the
    re-check that catches a change inotify did not report)."""
    use_inotify: bool = True
    """Wait for a regular file's changes with inotify (Linux); False: poll with backoff."""
    replay: bool = True
    """/dev/kmsg: read the ring buffer's records from the oldest on at start, skipping those an
    earlier run of this boot handled (the position file in the state dir); False: start at the
    end (XIDs logged while the agent was down are lost)."""
    select_timeout_s: PositiveSeconds = 0.5
    """How long one wait on /dev/kmsg or a FIFO lasts before the reader checks for stop."""
    max_line_bytes: Annotated[int, Meta(ge=256, le=1 << 20)] = 8192
    """Longer lines are cut (a /dev/kmsg record is at most 8 KiB)."""
    queue_max: PositiveInt = 10_000
    """Lines waiting for the event loop; beyond this, lines are dropped and counted."""
    file_lookback_s: Seconds = 300.0
    """A followed file with no position of this boot (the first start on a node, the first
    after a reboot): lines dated within this window before start are read back, like
    node-problem-detector's ``lookback`` (undated lines within ``file_lookback_bytes``
    too); a line dated before this boot never is. Later starts resume at the saved position."""
    file_lookback_bytes: Annotated[int, Meta(ge=0, le=1 << 30)] = 1 << 20
    """The most of a followed file read back at a first start, from its end (never the
    whole file); 0: start at the end (lines written before the follower attached are lost)."""
    file_position_save_s: PositiveSeconds = 1.0
    """A followed file: the saved offset follows lines that are not XIDs at most this often
    (after an XID line it is saved at once)."""

    def check(self) -> None:
        if self.file_poll_max_s < self.file_poll_interval_s:
            raise SettingError("file_poll_max_s", "must not be below file_poll_interval_s")


class DcgmSettings(Settings, frozen=True, kw_only=True):
    scrape_interval_s: PositiveSeconds = 15.0
    """dcgm-exporter collects every 30 s by default; scraping much faster adds nothing."""
    timeout_s: PositiveSeconds = 5.0
    """One scrape, connect to last byte."""
    max_body_bytes: Annotated[int, Meta(ge=1024)] = 16 * 1024 * 1024
    """A larger response is refused (a broken or hostile endpoint)."""
