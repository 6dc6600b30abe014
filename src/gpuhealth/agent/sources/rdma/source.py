"""RDMA source: the node's InfiniBand and RoCE ports, polled from sysfs.

Every ``poll_interval_s`` the source lists ``<sysfs_root>/class/infiniband`` and reads each
device's ports (:mod:`gpuhealth.agent.sources.rdma.sysfs`) in that device's own thread
(:class:`~gpuhealth.agent.sources.call_thread.CallThread`: a port counter is a command to the
NIC's firmware, which can hang), each read within ``read_deadline_s``. A device whose read
passed it is *unread* that poll and is not asked again until that read returns; the others are
read as usual. Each poll hands one :class:`~gpuhealth.agent.observations.NicObservation` (every
port read, each paired with the GPUs behind it: :mod:`gpuhealth.agent.sources.rdma.topology`)
to the health engine, which judges the rails (:mod:`gpuhealth.agent.health.rails`).

Nothing a NIC does ends the source: a device that vanished (hot-removed) is logged and
counted and its ports go; an unreadable file or a garbage value is logged when it starts and
when it ends, and counted every poll; a counter the port does not serve, or one stuck at its
maximum, is logged and counted once. No directory (no RDMA driver) is no ports.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from gpuhealth.agent.counters import Counters, CounterSpec, Histogram
from gpuhealth.agent.observations import (
    NicObservation,
    NicPortSample,
    ObservationSink,
    PciAddress,
    SourceName,
)
from gpuhealth.agent.sources.call_thread import CallThread, await_call
from gpuhealth.agent.sources.rdma.settings import DEFAULT_SYSFS_ROOT, RdmaSettings
from gpuhealth.agent.sources.rdma.sysfs import DeviceGone, DeviceRead, read_device
from gpuhealth.agent.sources.rdma.topology import GpuPlace, gpu_places
from gpuhealth.common.clock import Clock
from gpuhealth.common.logging import get_logger

log = get_logger("rdma")

RDMA_READ_ERRORS = CounterSpec(
    "rdma_read_errors",
    "InfiniBand/RoCE port files that could not be used at a poll: unreadable (an I/O or "
    "permission error) or garbage (a value that does not parse); the value is left out, never "
    "judged.",
    label="reason",
)
RDMA_READ_TIMEOUTS = CounterSpec(
    "rdma_read_timeouts",
    "NIC reads that passed rdma.read_deadline_s (the NIC is unread until the read returns).",
    label="device",
)
RDMA_COUNTERS_UNAVAILABLE = CounterSpec(
    "rdma_counters_unavailable",
    "Port counters a port does not serve ('N/A (no PMA)', EINVAL, EOPNOTSUPP), each counted once.",
)
RDMA_COUNTERS_SATURATED = CounterSpec(
    "rdma_counters_saturated",
    "Port counters found stuck at their maximum (the InfiniBand port counters stop there): "
    "their growth cannot be seen until they are reset (perfquery -R); counted when one "
    "reaches it.",
)
RDMA_DEVICES_REMOVED = CounterSpec(
    "rdma_devices_removed",
    "RDMA devices gone since the previous poll (a hot-removed NIC, an unloaded driver): "
    "their ports and rail verdicts went with them.",
)


Listing = tuple[list[str], dict[PciAddress, GpuPlace]]
"""The devices to read, and where the GPUs are."""


@dataclass(slots=True)
class _Nic:
    """One RDMA device between polls."""

    thread: CallThread
    pending: Future[DeviceRead] | None = None
    """A read that passed its deadline and has not returned yet."""
    pairing: tuple[object, ...] = ()


class _Late:
    """A read that passed its deadline."""


_LATE = _Late()


class RdmaSource:
    """A :class:`~gpuhealth.agent.sources.base.Source` of the node's InfiniBand and RoCE
    ports. ``gpus``: the GPUs' PCI addresses the agent knows now (the health engine's)."""

    name: SourceName = "rdma"

    def __init__(
        self,
        settings: RdmaSettings,
        clock: Clock,
        gpus: Callable[[], Sequence[PciAddress]] = tuple,
        *,
        sysfs_root: str | None = None,
    ) -> None:
        """``sysfs_root``: the root to read (the factory's :meth:`RdmaSettings.root_for`);
        None: the settings' ``sysfs_root``, else ``/sys``."""
        self.settings = settings
        self.root = Path(sysfs_root or settings.sysfs_root or DEFAULT_SYSFS_ROOT)
        self._clock = clock
        self._gpus = gpus
        self.counters = Counters(
            RDMA_READ_ERRORS,
            RDMA_READ_TIMEOUTS,
            RDMA_COUNTERS_UNAVAILABLE,
            RDMA_COUNTERS_SATURATED,
            RDMA_DEVICES_REMOVED,
        )
        self.polls = Histogram()
        self.errors = 0
        """Polls that failed: the device list could not be read, or a NIC's read failed."""
        self.up = False
        self.ready = False
        self.last_poll_duration_s = 0.0
        self._listing: CallThread | None = None
        self._listing_pending: Future[Listing] | None = None
        self._nics: dict[str, _Nic] = {}
        self._failing: dict[str, str] = {}
        """``<device>/<file>`` -> the problem logged when it started (logged again when it
        ends)."""
        self._unavailable: set[str] = set()
        self._saturated: set[str] = set()
        self._any: bool | None = None

    async def run(self, sink: ObservationSink) -> None:
        log.info(
            "rdma_source_started",
            sysfs_root=str(self.root),
            poll_interval_s=self.settings.poll_interval_s,
            devices=sorted(self.settings.devices) or "all",
            pairing=self.settings.pairing,
        )
        self._listing = CallThread("rdma-sysfs")
        try:
            while True:
                started = time.perf_counter()
                obs = await self.poll()
                if obs is not None:
                    sink(obs)
                self.last_poll_duration_s = time.perf_counter() - started
                self.polls.observe(self.last_poll_duration_s)
                await self._clock.sleep(self.settings.poll_interval_s)
        finally:
            self._listing.stop()
            self._listing = None
            for nic in self._nics.values():
                nic.thread.stop()
            self._nics.clear()

    async def poll(self) -> NicObservation | None:
        """One poll of every device (run's body; tests call it). None when the device list
        could not be read (nothing is judged then)."""
        listing = self._listing = self._listing or CallThread("rdma-sysfs")
        deadline = self.settings.read_deadline_s
        pending = self._listing_pending
        if pending is not None and not pending.done():
            self._failed("rdma_listing_still_hung")
            return None
        addresses = tuple(self._gpus())
        fut = listing.submit(lambda: self._list(addresses))
        try:
            names, places = await asyncio.wait_for(await_call(fut), deadline)
        except TimeoutError:
            self._listing_pending = fut
            self._failed("rdma_listing_timeout", deadline_s=deadline)
            return None
        except OSError as exc:
            self._failed("rdma_listing_failed", error=f"{type(exc).__name__}: {exc}")
            return None
        self._listing_pending = None
        if self._any is not bool(names):
            self._any = bool(names)
            if names:
                log.info("rdma_devices_present", devices=names)
            else:
                log.info("rdma_no_devices", path=str(self.root / "class" / "infiniband"))
        return await self._read_all(names, places)

    def _list(self, addresses: Sequence[PciAddress]) -> Listing:
        """In the listing thread: the devices to read, and where the GPUs are."""
        folder = self.root / "class" / "infiniband"
        try:
            names = sorted(os.listdir(folder))
        except FileNotFoundError:
            return [], {}
        wanted = self.settings.devices
        names = [
            n
            for n in names
            if (not wanted or n in wanted)
            and (
                self.settings.include_virtual_functions
                or not (folder / n / "device" / "physfn").is_symlink()
            )
        ]
        return names, gpu_places(self.root, addresses) if names else {}

    async def _read_all(
        self, names: list[str], places: dict[PciAddress, GpuPlace]
    ) -> NicObservation:
        deadline = self.settings.read_deadline_s
        unread: set[str] = set()
        started: dict[str, Future[DeviceRead]] = {}
        for name in names:
            nic = self._nics.get(name)
            if nic is None:
                nic = self._nics[name] = _Nic(CallThread(f"rdma-{name}"))
            if nic.pending is not None and not nic.pending.done():
                unread.add(name)  # its last read is still hung: not asked again
                continue
            nic.pending = None
            started[name] = nic.thread.submit(
                partial(read_device, self.root, name, places, reach=self.settings.pairing)
            )
        outcomes = await asyncio.gather(*(self._outcome(fut, deadline) for fut in started.values()))
        ports: list[NicPortSample] = []
        gone = set(self._nics) - set(names)
        failed = bool(unread)
        for (name, fut), outcome in zip(started.items(), outcomes, strict=True):
            if outcome is _LATE:
                unread.add(name)
                failed = True
                self._nics[name].pending = fut
                self.counters.inc(RDMA_READ_TIMEOUTS, label=name)
                log.warning("rdma_read_timeout", device=name, deadline_s=deadline)
            elif isinstance(outcome, DeviceGone):
                gone.add(name)
            elif isinstance(outcome, DeviceRead):
                if not outcome.complete:
                    unread.add(name)
                self._note(name, outcome)
                ports.extend(outcome.ports)
            else:
                unread.add(name)
                failed = True
                log.error("rdma_read_failed", device=name, error=repr(outcome))
        for name in sorted(gone):
            self._removed(name)
        self.up = not failed
        self.errors += failed
        self.ready = True
        return NicObservation(
            source="rdma", at=self._clock.now(), ports=tuple(ports), unread=frozenset(unread)
        )

    @staticmethod
    async def _outcome(fut: Future[DeviceRead], deadline: float) -> object:
        try:
            return await asyncio.wait_for(await_call(fut), deadline)
        except TimeoutError:
            return _LATE
        except Exception as exc:  # DeviceGone, or a bug: reported, never the source's end
            return exc

    def _failed(self, event: str, **detail: object) -> None:
        self.up = False
        self.errors += 1
        log.warning(event, sysfs_root=str(self.root), **detail)

    def _removed(self, name: str) -> None:
        nic = self._nics.pop(name, None)
        if nic is None:
            return
        nic.thread.stop()  # after a read still hung returns, if one is
        self.counters.inc(RDMA_DEVICES_REMOVED)
        log.warning("rdma_device_removed", device=name)
        prefix = f"{name}/"
        self._failing = {k: v for k, v in self._failing.items() if not k.startswith(prefix)}
        self._saturated = {k for k in self._saturated if not k.startswith(prefix)}

    def _note(self, name: str, read: DeviceRead) -> None:
        """Log and count what one device's read could not use; log its pairing when new."""
        prefix = f"{name}/"
        now = {prefix + p.path: p for p in read.problems}
        for key, p in now.items():
            self.counters.inc(RDMA_READ_ERRORS, label=p.kind)
            if key not in self._failing:
                log.warning(
                    "rdma_file_unusable", device=name, file=p.path, problem=p.kind, detail=p.detail
                )
            self._failing[key] = p.kind
        for key in [k for k in self._failing if k.startswith(prefix) and k not in now]:
            del self._failing[key]
            log.info("rdma_file_readable_again", device=name, file=key.removeprefix(prefix))
        for rel in read.unavailable:
            key = prefix + rel
            if key not in self._unavailable:
                self._unavailable.add(key)
                self.counters.inc(RDMA_COUNTERS_UNAVAILABLE)
                log.info("rdma_counter_unavailable", device=name, file=rel)
        saturated = {f"{prefix}{p.port}/{c}" for p in read.ports for c in p.saturated}
        for key in sorted(saturated - self._saturated):
            self.counters.inc(RDMA_COUNTERS_SATURATED)
            log.warning(
                "rdma_counter_saturated",
                counter=key,
                hint="the counter stopped at its maximum: its growth is not seen until it is "
                "reset (perfquery -R); link-down events are still seen by the polls",
            )
        self._saturated = {k for k in self._saturated if not k.startswith(prefix)} | saturated
        self._note_pairing(name, read.ports)

    def _note_pairing(self, name: str, ports: Sequence[NicPortSample]) -> None:
        nic = self._nics[name]
        first = ports[0] if ports else None
        pairing = (
            (first.gpus, first.affinity, first.netdev, tuple(p.link_layer for p in ports))
            if first is not None
            else ()
        )
        if pairing == nic.pairing:
            return
        nic.pairing = pairing
        gpus = [str(a) for a in first.gpus] if first is not None else []
        (log.info if gpus else log.warning)(
            "rdma_device_paired" if gpus else "rdma_device_unpaired",
            device=name,
            ports=[p.port for p in ports],
            link_layers=sorted({p.link_layer for p in ports}),
            netdev=first.netdev if first is not None else "",
            gpus=gpus,
            affinity=first.affinity if first is not None else "",
            **(
                {}
                if gpus
                else {
                    "detail": f"no GPU within rdma.pairing={self.settings.pairing}: its "
                    "verdicts reach no GPU"
                }
            ),
        )
