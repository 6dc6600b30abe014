"""dcgm-exporter source: scrape a node-local ``/metrics`` and map DCGM_FI_DEV_* fields.

An alternative to NVML where dcgm-exporter already runs. Series are grouped per GPU by
their ``UUID`` label; the ``gpu``, ``pci_bus_id`` and ``modelName`` labels give the
inventory. ``DCGM_FI_DEV_XID_ERRORS`` holds the *last* XID a GPU reported, so a change of
that value is reported as a new XID (repeats of the same code between scrapes are not
visible through dcgm-exporter; the kernel-log follower sees them). A failed scrape is
counted and retried on the next interval; it never ends the source.
"""

from __future__ import annotations

import math
import time
from typing import Annotated, Any

import aiohttp
from msgspec import Meta
from prometheus_client.parser import text_string_to_metric_families

from gpuhealth.agent.counters import Counters, CounterSpec, Histogram
from gpuhealth.agent.observations import (
    GpuIdentity,
    GpuSample,
    Inventory,
    Observation,
    ObservationSink,
    SourceName,
    XidObservation,
)
from gpuhealth.agent.sources.nvml_device import throttle_reason_names
from gpuhealth.common.clock import Clock
from gpuhealth.common.config import PositiveSeconds, Settings
from gpuhealth.common.logging import get_logger

log = get_logger("dcgm")
MIB = 1024 * 1024

_NVLINK_ERRORS = frozenset(
    {
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    }
)
_FIELDS: dict[str, str] = {
    "DCGM_FI_DEV_GPU_TEMP": "temperature_c",
    "DCGM_FI_DEV_MEMORY_TEMP": "memory_temperature_c",
    "DCGM_FI_DEV_SLOWDOWN_TEMP": "slowdown_temperature_c",
    "DCGM_FI_DEV_SHUTDOWN_TEMP": "shutdown_temperature_c",
    "DCGM_FI_DEV_POWER_USAGE": "power_w",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": "power_limit_w",
    "DCGM_FI_DEV_GPU_UTIL": "utilization_ratio",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "memory_utilization_ratio",
    "DCGM_FI_DEV_SM_CLOCK": "sm_clock_hz",
    "DCGM_FI_DEV_MEM_CLOCK": "memory_clock_hz",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "ecc_sbe_volatile",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "ecc_dbe_volatile",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": "ecc_sbe_aggregate",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": "ecc_dbe_aggregate",
    "DCGM_FI_DEV_RETIRED_SBE": "retired_pages_sbe",
    "DCGM_FI_DEV_RETIRED_DBE": "retired_pages_dbe",
    "DCGM_FI_DEV_RETIRED_PENDING": "retired_pages_pending",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "remapped_rows_correctable",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "remapped_rows_uncorrectable",
    "DCGM_FI_DEV_ROW_REMAP_PENDING": "row_remap_pending",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "row_remap_failure",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "pcie_replay_count",
    "DCGM_FI_DEV_FAN_SPEED": "fan_speed_ratio",
    "DCGM_FI_DEV_PSTATE": "performance_state",
}
_INTS = frozenset(
    {
        "ecc_sbe_volatile",
        "ecc_dbe_volatile",
        "ecc_sbe_aggregate",
        "ecc_dbe_aggregate",
        "retired_pages_sbe",
        "retired_pages_dbe",
        "remapped_rows_correctable",
        "remapped_rows_uncorrectable",
        "pcie_replay_count",
        "performance_state",
    }
)
_BOOLS = frozenset({"retired_pages_pending", "row_remap_pending", "row_remap_failure"})
_PERCENT = frozenset({"utilization_ratio", "memory_utilization_ratio", "fan_speed_ratio"})
_MHZ = frozenset({"sm_clock_hz", "memory_clock_hz"})


class DcgmSettings(Settings, frozen=True, kw_only=True):
    scrape_interval_s: PositiveSeconds = 15.0
    """dcgm-exporter collects every 30 s by default; scraping much faster adds nothing."""
    timeout_s: PositiveSeconds = 5.0
    """One scrape, connect to last byte."""
    max_body_bytes: Annotated[int, Meta(ge=1024)] = 16 * MIB
    """A larger response is refused (a broken or hostile endpoint)."""


DCGM_SCRAPES = CounterSpec("dcgm_scrapes", "dcgm-exporter scrapes that worked.")


class DcgmExporterSource:
    """A :class:`~gpuhealth.agent.sources.base.Source` fed by a dcgm-exporter endpoint.

    A failed scrape is one of its ``errors`` (``gpuhealth_agent_source_errors_total``) and
    makes it down until a scrape works again.
    """

    name: SourceName = "dcgm"

    def __init__(self, url: str, settings: DcgmSettings, clock: Clock) -> None:
        self.url = url
        self.settings = settings
        self._clock = clock
        self._last_xid: dict[str, int] = {}
        self._inventory: Inventory | None = None
        self.counters = Counters(DCGM_SCRAPES)
        self.errors = 0
        """Failed scrapes."""
        self.polls = Histogram()
        """Duration of each scrape, failed or not."""
        self.last_poll_duration_s = 0.0
        self.up = False

    @property
    def ready(self) -> bool:
        """A scrape has worked (the inventory is known)."""
        return self._inventory is not None

    def pci_to_uuid(self, pci_bus_id: str) -> str | None:
        inv = self._inventory
        if inv is None:
            return None
        want = pci_bus_id.upper()
        return next((g.uuid for g in inv.gpus if g.pci_bus_id == want), None)

    async def run(self, sink: ObservationSink) -> None:
        timeout = aiohttp.ClientTimeout(total=self.settings.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                started = time.perf_counter()
                try:
                    text = await self._fetch(session)
                    observations = self.parse(text)
                except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                    self.up = False
                    self.errors += 1
                    log.warning(
                        "dcgm_scrape_failed", url=self.url, error=f"{type(exc).__name__}: {exc}"
                    )
                else:
                    self.up = True
                    self.counters.inc(DCGM_SCRAPES)
                    for obs in observations:
                        sink(obs)
                self.last_poll_duration_s = time.perf_counter() - started
                self.polls.observe(self.last_poll_duration_s)
                await self._clock.sleep(self.settings.scrape_interval_s)

    async def _fetch(self, session: aiohttp.ClientSession) -> str:
        async with session.get(self.url) as resp:
            if resp.status != 200:
                raise ValueError(f"HTTP {resp.status}")
            body = await resp.content.read(self.settings.max_body_bytes + 1)
            if len(body) > self.settings.max_body_bytes:
                raise ValueError(f"response larger than {self.settings.max_body_bytes} bytes")
            return body.decode("utf-8", "replace")

    def parse(self, text: str) -> list[Observation]:
        """Map one scrape to observations: the inventory when it changed, samples, new XIDs."""
        now = self._clock.now()
        per_gpu: dict[str, dict[str, Any]] = {}
        idents: dict[str, GpuIdentity] = {}
        xids: dict[str, tuple[int, str]] = {}
        driver: str | None = None
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = s.labels
                uuid = labels.get("UUID") or labels.get("uuid")
                name = s.name
                if not uuid or not name.startswith("DCGM_FI_"):
                    continue
                if name.endswith("_total"):  # the parser appends it to counter samples
                    name = name[:-6]
                if uuid not in idents:
                    idents[uuid] = _identity(uuid, labels)
                    driver = labels.get("DCGM_FI_DRIVER_VERSION") or driver
                fields = per_gpu.setdefault(uuid, {})
                self._map(name, float(s.value), labels, fields, xids=xids, uuid=uuid)
        out: list[Observation] = []
        inv = Inventory(
            source="dcgm",
            gpus=tuple(sorted(idents.values(), key=lambda g: g.index)),
            driver_version=driver,
        )
        if idents and inv != self._inventory:
            self._inventory = inv
            out.append(inv)
        for uuid, fields in per_gpu.items():
            fields.pop("_fb_free", None)
            out.append(GpuSample(uuid=uuid, at=now, **fields))
        for uuid, (code, msg) in xids.items():
            if code and code != self._last_xid.get(uuid, 0):
                ident = idents[uuid]
                out.append(
                    XidObservation(
                        source="dcgm",
                        xid=code,
                        at=now,
                        uuid=uuid,
                        pci_bus_id=ident.pci_bus_id,
                        message=msg,
                    )
                )
            self._last_xid[uuid] = code
        return out

    @staticmethod
    def _map(
        name: str,
        value: float,
        labels: dict[str, str],
        fields: dict[str, Any],
        *,
        xids: dict[str, tuple[int, str]],
        uuid: str,
    ) -> None:
        if math.isnan(value):  # DCGM had no value
            return
        if name == "DCGM_FI_DEV_XID_ERRORS":
            xids[uuid] = (int(value), labels.get("err_msg", ""))
        elif name in _NVLINK_ERRORS:
            fields["nvlink_errors"] = fields.get("nvlink_errors", 0) + int(value)
        elif name in ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"):
            fields["throttle_reasons"] = throttle_reason_names(int(value))
        elif name == "DCGM_FI_DEV_FB_USED":
            fields["memory_used_bytes"] = int(value * MIB)
            if "_fb_free" in fields:
                fields["memory_total_bytes"] = int((value + fields["_fb_free"]) * MIB)
        elif name == "DCGM_FI_DEV_FB_FREE":
            fields["_fb_free"] = value
            if "memory_used_bytes" in fields:
                fields["memory_total_bytes"] = fields["memory_used_bytes"] + int(value * MIB)
        else:
            key = _FIELDS.get(name)
            if key is None:
                return
            if key in _INTS:
                fields[key] = int(value)
            elif key in _BOOLS:
                fields[key] = value != 0
            elif key in _PERCENT:
                fields[key] = value / 100.0
            elif key in _MHZ:
                fields[key] = value * 1e6
            else:
                fields[key] = value


def _identity(uuid: str, labels: dict[str, str]) -> GpuIdentity:
    try:
        index = int(labels.get("gpu", "0"))
    except ValueError:
        index = 0
    return GpuIdentity(
        index=index,
        uuid=uuid,
        model=labels.get("modelName", ""),
        pci_bus_id=labels.get("pci_bus_id", "").upper(),
    )
