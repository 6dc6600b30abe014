"""dcgm-exporter source: scrape a node-local ``/metrics`` and map DCGM_FI_DEV_* fields.

An alternative to NVML where dcgm-exporter already runs. One scrape is parsed and reduced to
one value per GPU and field (:mod:`gpuhealth.agent.sources.dcgm.parse`: the copies that
dcgm-exporter writes per pod on shared GPUs and per MIG instance are not summed); the
``gpu``, ``pci_bus_id`` and ``modelName`` labels give the inventory.
``DCGM_FI_DEV_XID_ERRORS`` holds the *last* XID a GPU reported, so only a change of that
value is a new XID, judged against a baseline kept in the state dir
(:mod:`gpuhealth.agent.sources.dcgm.xid_baseline`). After the first scrape that worked, and whenever
it changes, the source says which health rules are blind because the exporter serves none
of their fields (:mod:`gpuhealth.agent.sources.dcgm.fields`). A failed scrape is counted
and retried on the next interval; it never ends the source.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import aiohttp

from gpuhealth.agent.boot import read_boot_id
from gpuhealth.agent.counters import Counters, CounterSpec, Histogram
from gpuhealth.agent.observations import (
    Inventory,
    Observation,
    ObservationSink,
    PciAddress,
    SourceName,
    XidObservation,
)
from gpuhealth.agent.sources.dcgm.fields import RULE_FIELDS, blind_rules
from gpuhealth.agent.sources.dcgm.parse import Scrape, gpu_sample, gpu_xids, parse_exposition
from gpuhealth.agent.sources.dcgm.settings import DcgmSettings
from gpuhealth.agent.sources.dcgm.xid_baseline import XidBaseline, XidChange
from gpuhealth.agent.state_store import StateStore
from gpuhealth.common.clock import Clock
from gpuhealth.common.logging import get_logger

log = get_logger("dcgm")
MIB = 1024 * 1024
COUNTERS_CSV = "deploy/helm/gpuhealth/files/dcgm-exporter/gpuhealth-counters.csv"


DCGM_SCRAPES = CounterSpec("dcgm_scrapes", "dcgm-exporter scrapes that worked.")
DCGM_XIDS = CounterSpec(
    "dcgm_xids", "New XIDs seen through DCGM_FI_DEV_XID_ERRORS (a change of its value)."
)
DCGM_XID_BASELINES = CounterSpec(
    "dcgm_xid_baselines",
    "DCGM_FI_DEV_XID_ERRORS values taken as a GPU's baseline and not reported (first value "
    "of a GPU with no saved history: it may be days old).",
)
DCGM_SERIES_COPIES = CounterSpec(
    "dcgm_series_copies",
    "dcgm-exporter series dropped as copies of another (one per pod on shared GPUs, one per "
    "MIG instance), not added up.",
)


class DcgmExporterSource:
    """A :class:`~gpuhealth.agent.sources.base.Source` fed by a dcgm-exporter endpoint.

    A failed scrape is one of its ``errors`` (``gpuhealth_agent_source_errors_total``) and
    makes it down until a scrape works again. ``state`` keeps the XID baseline across
    restarts (None: in memory only).
    """

    name: SourceName = "dcgm"

    def __init__(
        self,
        url: str,
        settings: DcgmSettings,
        clock: Clock,
        *,
        state: StateStore | str | None = None,
        boot_id: str | None = None,
    ) -> None:
        """``state``: where the XID baseline is kept across restarts (None: in memory)."""
        self.url = url
        self.settings = settings
        self._clock = clock
        self._xids = XidBaseline(state, boot_id if boot_id is not None else read_boot_id())
        self._inventory: Inventory | None = None
        self._blind: dict[str, tuple[str, ...]] | None = None
        self.counters = Counters(DCGM_SCRAPES, DCGM_XIDS, DCGM_XID_BASELINES, DCGM_SERIES_COPIES)
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

    def blind_rules(self) -> Mapping[str, tuple[str, ...]] | None:
        """Rule -> the fields it needs, for each rule the exporter feeds nothing (none of
        those fields has a value for any GPU); None before the first scrape that worked."""
        return self._blind

    @property
    def rules(self) -> tuple[str, ...]:
        """Every rule :meth:`blind_rules` judges."""
        return tuple(RULE_FIELDS)

    async def run(self, sink: ObservationSink) -> None:
        log.info("dcgm_source_started", url=self.url, counters_csv=COUNTERS_CSV)
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
                    self.save_state()
                self.last_poll_duration_s = time.perf_counter() - started
                self.polls.observe(self.last_poll_duration_s)
                await self._clock.sleep(self.settings.scrape_interval_s)

    def save_state(self) -> None:
        """Save the XID baseline (when it changed) for the next start."""
        self._xids.save()

    async def _fetch(self, session: aiohttp.ClientSession) -> str:
        async with session.get(self.url) as resp:
            if resp.status != 200:
                raise ValueError(f"HTTP {resp.status}")
            body = await resp.content.read(self.settings.max_body_bytes + 1)
            if len(body) > self.settings.max_body_bytes:
                raise ValueError(f"response larger than {self.settings.max_body_bytes} bytes")
            return body.decode("utf-8", "replace")

    def parse(self, text: str) -> list[Observation]:
        """Map one scrape to observations: the inventory when it changed, samples, new XIDs.
        ValueError when the text is not Prometheus text (nothing is judged then)."""
        scrape = parse_exposition(text)
        now = self._clock.now()
        self.counters.inc(DCGM_SERIES_COPIES, scrape.copies)
        self._judge_coverage(scrape)
        out: list[Observation] = []
        inv = Inventory(
            source="dcgm",
            gpus=tuple(sorted((g.identity for g in scrape.gpus.values()), key=lambda g: g.index)),
            driver_version=scrape.driver_version,
        )
        if scrape.gpus and inv != self._inventory:
            self._inventory = inv
            out.append(inv)
        out.extend(gpu_sample(gpu, now) for gpu in scrape.gpus.values())
        for uuid, gpu in scrape.gpus.items():
            reported: set[int] = set()
            for instance, (code, message) in gpu_xids(gpu).items():
                key = uuid if instance is None else f"{uuid}/gi{instance}"
                verdict = self._xids.judge(key, code)
                if verdict is XidChange.BASELINE:
                    self.counters.inc(DCGM_XID_BASELINES)
                    log.info("dcgm_xid_baseline", gpu=uuid, gpu_instance=instance, xid=code)
                elif verdict is XidChange.NEW and code not in reported:
                    reported.add(code)  # the GPU's series and an instance's: one XID
                    self.counters.inc(DCGM_XIDS)
                    out.append(
                        XidObservation(
                            source="dcgm",
                            xid=code,
                            at=now,
                            uuid=uuid,
                            pci=PciAddress.parse(gpu.identity.pci_bus_id),
                            message=message,
                        )
                    )
        return out

    def _judge_coverage(self, scrape: Scrape) -> None:
        if not scrape.gpus:
            return
        blind = blind_rules(scrape.fields_seen)
        if blind == self._blind:
            return
        self._blind = blind
        if blind:
            log.warning(
                "dcgm_rules_blind",
                url=self.url,
                rules={rule: list(fields) for rule, fields in blind.items()},
                hint=f"serve these fields from dcgm-exporter: {COUNTERS_CSV}",
            )
        else:
            log.info("dcgm_rules_covered", url=self.url)
