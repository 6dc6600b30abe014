"""The GPU's CPER log through NVML: what happened while the agent was down.

The driver keeps the GPU's recent error groups as UEFI Common Platform Error Records (the
records the BMC collects); ``nvmlSystemGetCPER_v1`` reads them with a cursor (one GPU per
cursor, ``NVML_CPER_ACCESS_TYPE_GPU``; root only; R610+ bindings, records from R615 drivers).
:class:`CperReader` reads every GPU's records and hands on those the agent has not seen, as
:class:`~gpuhealth.agent.observations.OperationalEventObservation` with ``via="cper"``: each
record's id (= the event group's cursor NVML's live events carry) is remembered per boot in
the agent's state store (:class:`CperSeenIds`, the ``cper_seen`` document), once the record's
observations were handed on. The read-back comes right *after* the live registration
(:class:`~gpuhealth.agent.sources.nvml.operational.OperationalEventWaiter`), so a fault in
between is in both, and counted once (by record id here, by group cursor, module and code in
the engine), never in neither.

Each record is decoded (:mod:`gpuhealth.agent.sources.nvml.cper_record`): one observation per
NVIDIA event section, with its module, category, code and legacy Xid, so a record read back
is the same occurrence as its kernel-log line (the engine's XID dedup). A record whose NVIDIA
sections cannot all be decoded is reported whole (module ``CPER``, ``decoded=False``), judged
by its CPER severity (never above degraded). The record flags are the group's attributes
(RECOVERED, PREVERR, SIMULATED) only from R620 (:data:`GROUP_FLAGS_SINCE`).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import msgspec

from gpuhealth.agent.counters import Counters, CounterSpec
from gpuhealth.agent.observations import ObservationSink, OperationalEventObservation
from gpuhealth.agent.sources.nvml.cper_record import CperError, CperRecord, parse_records
from gpuhealth.agent.sources.nvml.gpu import NvmlGpu
from gpuhealth.agent.state_store import StateStore
from gpuhealth.common.logging import get_logger

log = get_logger("nvml")

CPER_REPLAYED = CounterSpec(
    "nvml_cper_replayed",
    "CPER records read back at start (nvmlSystemGetCPER_v1) that the agent had not handled: "
    "reported as operational events.",
)
CPER_SEEN = CounterSpec(
    "nvml_cper_already_seen", "CPER records read back at start that the agent had handled."
)
CPER_MALFORMED = CounterSpec(
    "nvml_cper_malformed", "CPER reads that were not UEFI records, or larger than 4 MiB."
)
CPER_MALFORMED_SECTIONS = CounterSpec(
    "nvml_cper_malformed_sections",
    "NVIDIA event sections of CPER records read back that could not be decoded (lengths that "
    "do not fit, an unknown header version, a broken context): the record is reported "
    "undecoded, by its CPER severity.",
)
CPER_COUNTERS = (CPER_REPLAYED, CPER_SEEN, CPER_MALFORMED, CPER_MALFORMED_SECTIONS)
CPER_SEVERITY = {0: 30, 1: 40, 2: 20, 3: 10}
"""UEFI error severity (0 recoverable, 1 fatal, 2 corrected, 3 informational) ->
nvmlOperationalEventSeverity_t. The driver writes a FATAL event's section as RECOVERABLE (open
kernel modules, ``op_event_log_entry.c`` ``_gpuOpEventCperSeverity``): read back, it is
RECOVERABLE, which the event catalog judges alike."""
GROUP_ATTRIBUTE_BITS = 0x7
"""UEFI record flags RECOVERED 1, PREVERR 2, SIMULATED 4: the same bits as
``NVML_OPERATIONAL_EVENT_GROUP_ATTR_*``."""
GROUP_FLAGS_SINCE = 620
"""The first driver release whose CPER record flags carry the event group's attributes
(RECOVERED, PREVERR, SIMULATED): R615's ``cperInit`` writes 0 there, and what a record's flags
say on an older or unknown driver is not read as group attributes."""
MAX_RECORDS_PER_GPU = 256
BUFFER_BYTES = 64 * 1024
MAX_BUFFER_BYTES = 4 << 20
CPER_MODULE = "CPER"
NAME = "cper_seen"
"""The state store's per-boot document of the record ids handled: ``{uuid: [id, ...]}``."""
MAX_SEEN = 1024
"""Record ids kept per GPU (the oldest go first)."""


def _record_key(obs: OperationalEventObservation) -> tuple[str | None, int, str, int]:
    """Consecutive observations of one record read back share it; two live events never do."""
    return (obs.uuid, obs.group_cursor, obs.via, 0 if obs.via == "cper" else id(obs))


class CperSeen(Protocol):
    """Which CPER record ids (event-group cursors) the agent has handled, per GPU."""

    def seen(self, uuid: str) -> frozenset[int]: ...


class CperSeenIds:
    """:class:`CperSeen` as a per-boot document of the agent's state store (``cper_seen``):
    the driver's CPER log and its record ids start over with the driver, so a new boot starts
    empty, and an agent restart on the same boot does not report a handled record again. At
    most :data:`MAX_SEEN` ids per GPU, the oldest dropped first.

    **Threads.** :meth:`seen` may be called from any thread (the CPER read-back runs in the NVML
    system thread); it reads the ids kept in memory. :meth:`hand_on`, the only write, runs on
    the event loop: the NVML threads hand it there with ``loop.call_soon_threadsafe``, never
    writing the store themselves. Writing from a waiter thread through the store's lock would be
    safe for the database (the connection is opened with ``check_same_thread=False`` and every
    statement and transaction holds the store's ``RLock``), but it would be wrong twice over:

    - the id would be on disk before the observation was handled: the waiter marks an event
      seen, then queues it for the loop, and a kill in between loses the event for good (the
      restart's read-back skips it). On the loop the id is written after the sink returned,
      in the same transaction as what the sink wrote (the engine driver joins it: outbox Event,
      latched verdicts), so both are on disk or neither is, and a kill in between only reads
      the record back again;
    - the thread would wait on the ``RLock`` for as long as the loop holds a transaction, and
      the loop on the thread's commit (an fsync on a durable store): a second writer to order
      against for nothing, where every other write of the store is the loop's.

    ``store`` None keeps the ids in memory only (tests, a source without a state dir). A store
    write that fails is logged by the store and costs at most a record reported twice after
    a restart: the ids stay in memory and the next write carries them."""

    def __init__(self, store: StateStore | str | Path | None, boot_id: str) -> None:
        self._store = StateStore.of(store) if store is not None else None
        self._boot_id = boot_id
        self._lock = threading.Lock()
        self._ids: dict[str, list[int]] = self._load()

    def _load(self) -> dict[str, list[int]]:
        if self._store is None:
            return {}
        raw, _ = self._store.boot_value(NAME, self._boot_id)
        if raw is None:
            return {}
        try:
            saved = msgspec.json.decode(raw, type=dict[str, list[int]])
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("cper_seen_unreadable", error=str(exc))
            return {}
        return {uuid: ids[-MAX_SEEN:] for uuid, ids in saved.items()}

    def seen(self, uuid: str) -> frozenset[int]:
        """The ids handled on this GPU (any thread)."""
        with self._lock:
            return frozenset(self._ids.get(uuid, ()))

    def hand_on(
        self, sink: ObservationSink, observations: Iterable[OperationalEventObservation]
    ) -> None:
        """On the event loop: each observation to ``sink``, then its group's id remembered, in
        one store transaction per record read back (all its sections) or live event (the engine
        driver's joins it, as it does for a kernel-log position); a live group's id with its
        last event only."""
        for (uuid, cursor, via, _), same in itertools.groupby(observations, _record_key):
            with self._transaction():
                last = True
                for obs in same:  # a record's events (one per section), or one live event
                    sink(obs)
                    last = obs.group_last
                if uuid and (cursor or via == "cper") and last:  # live 0: no group
                    self._add(uuid, cursor)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        if self._store is None:
            yield
            return
        with self._store.transaction():
            yield

    def _add(self, uuid: str, record_id: int) -> None:
        with self._lock:
            known = self._ids.setdefault(uuid, [])
            if record_id in known:
                return
            known.append(record_id)
            del known[:-MAX_SEEN]
            if self._store is None:
                return
            doc = msgspec.json.encode(self._ids)
        self._store.put_boot_value(NAME, self._boot_id, doc)


class CperReader:
    """Reads every GPU's CPER records (in an NVML thread) into observations."""

    def __init__(
        self,
        nvml: Any,
        counters: Counters,
        store: CperSeen,
        now: Callable[[], datetime],
        driver: int | None = None,
    ) -> None:
        """``driver``: the driver's release (620), None when not known: it decides whether the
        record flags are the group's attributes (:data:`GROUP_FLAGS_SINCE`)."""
        self._nvml = nvml
        self._counters = counters
        self._store = store
        self._now = now
        self._group_flags = driver is not None and driver >= GROUP_FLAGS_SINCE
        self.available: bool | None = None
        """None: not asked yet; False: the driver or bindings have no CPER read."""

    def read_gpu(self, uuid: str) -> list[CperRecord]:
        """Every record the driver holds for one GPU (empty where CPER is not offered)."""
        n = self._nvml
        fn = getattr(n, "nvmlSystemGetCPER_v1", None)
        req_t = getattr(n, "c_nvmlGetCPER_v1_t", None)
        if fn is None or req_t is None:
            self.available = False
            return []
        req = req_t()
        req.cursor.cperTypeMask = getattr(n, "NVML_CPER_ACCESS_TYPE_GPU", 1)
        req.cursor.uuid = uuid.encode()
        req.cursor.handle = getattr(n, "NVML_CPER_CURSOR_HANDLE_INIT", 0)
        size = BUFFER_BYTES
        out: list[CperRecord] = []
        for _ in range(MAX_RECORDS_PER_GPU):
            buf = (ctypes.c_ubyte * size)()
            req.buffer = ctypes.cast(buf, ctypes.POINTER(ctypes.c_ubyte))
            req.bufferSize = size
            try:
                fn(req)
            except n.NVMLError as exc:
                code = getattr(exc, "value", None)
                need = int(req.bufferSize)
                if code == getattr(n, "NVML_ERROR_INSUFFICIENT_SIZE", 7) and size < need:
                    if need > MAX_BUFFER_BYTES:
                        self._counters.inc(CPER_MALFORMED)
                        break
                    size = need
                    continue
                if code in (
                    getattr(n, "NVML_ERROR_FUNCTION_NOT_FOUND", 13),
                    getattr(n, "NVML_ERROR_NOT_SUPPORTED", 3),
                    getattr(n, "NVML_ERROR_NO_PERMISSION", 4),
                ):
                    # no CPER read: before R615, or not root (every GPU answers the same)
                    self.available = False
                log.info("nvml_cper_unavailable", uuid=uuid, error=str(exc))
                break
            self.available = True
            got = int(req.bufferSize)
            if got == 0:
                break  # no (more) records
            try:
                out += parse_records(bytes(buf[:got]))
            except CperError as exc:
                self._counters.inc(CPER_MALFORMED)
                log.warning("nvml_cper_malformed", uuid=uuid, error=str(exc))
        return out

    def replay(self, gpus: Sequence[NvmlGpu]) -> list[OperationalEventObservation]:
        """The records of every GPU the agent has not handled yet. Nothing is remembered here
        (this runs in the NVML system thread): :meth:`CperSeenIds.hand_on` does it on the
        event loop, once the observations were handed on."""
        out: list[OperationalEventObservation] = []
        self.available = None  # asked anew (a driver upgraded under the agent)
        for g in gpus:
            if self.available is False:
                break  # not offered by this driver: asking every GPU says the same
            uuid = g.identity.uuid
            records = self.read_gpu(uuid)
            seen = self._store.seen(uuid)
            fresh = [r for r in records if r.record_id not in seen]
            self._counters.inc(CPER_SEEN, len(records) - len(fresh))
            self._counters.inc(CPER_REPLAYED, len(fresh))
            for r in fresh:
                out += self.observations(uuid, r)
        return out

    def observations(self, uuid: str, r: CperRecord) -> list[OperationalEventObservation]:
        """One record's events: one per NVIDIA section, or the whole record undecoded when
        any of its NVIDIA sections could not be decoded (or it has none)."""
        at = r.timestamp or self._now()
        group = r.flags & GROUP_ATTRIBUTE_BITS if self._group_flags else 0
        if r.malformed:
            self._counters.inc(CPER_MALFORMED_SECTIONS, r.malformed)
            log.warning("nvml_cper_sections_malformed", uuid=uuid, record=r.record_id)
        if r.events and not r.malformed:
            return [
                OperationalEventObservation(
                    source="nvml",
                    at=at,
                    uuid=uuid,
                    module=e.module,
                    code=e.code,
                    category=e.category,
                    severity=CPER_SEVERITY.get(e.severity, 0),
                    scope=e.scope,
                    group_attributes=group,
                    legacy_xid=e.legacy_xid,
                    group_cursor=r.record_id,
                    via="cper",
                )
                for e in r.events
            ]
        return [
            OperationalEventObservation(
                source="nvml",
                at=at,
                uuid=uuid,
                module=CPER_MODULE,
                code=0,
                category=0,
                severity=CPER_SEVERITY.get(r.severity, 0),
                group_attributes=group,
                group_cursor=r.record_id,
                via="cper",
                decoded=False,
            )
        ]
