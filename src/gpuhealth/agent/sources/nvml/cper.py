"""The GPU's CPER log through NVML: what happened while the agent was down.

The driver keeps the GPU's recent error groups as UEFI Common Platform Error Records (the
records the BMC collects); ``nvmlSystemGetCPER_v1`` reads them with a cursor (one GPU per
cursor, ``NVML_CPER_ACCESS_TYPE_GPU``; root only; R610+ bindings, records from R615 drivers).
At the NVML source's start :class:`CperReader` reads every GPU's records and hands on those the
agent has not seen, as :class:`~gpuhealth.agent.observations.OperationalEventObservation`
with ``via="cper"``, deduplicated like the kernel-log replay: each record's id (= the event
group's cursor NVML's live events carry) is remembered per boot in the agent's state store
(:class:`CperSeenIds`, the ``cper_seen`` document), once the record's observation was handed
on.

Only the UEFI record header is decoded (record id, severity, timestamp, flags: RECOVERED /
PREVERR / SIMULATED, which R620 sets from the event group's attributes); the NVIDIA section's
layout is not in the bindings, so a record the agent did not see live is judged by its CPER
severity as an event of unknown module (never above degraded).
"""

from __future__ import annotations

import contextlib
import ctypes
import struct
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import msgspec

from gpuhealth.agent.counters import Counters, CounterSpec
from gpuhealth.agent.observations import ObservationSink, OperationalEventObservation
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
CPER_COUNTERS = (CPER_REPLAYED, CPER_SEEN, CPER_MALFORMED)
HEADER = struct.Struct("<4sHIHIII8s16s16s16s16sQIQ12s")
"""UEFI CPER record header (UEFI spec, appendix N): signature, revision, signature end,
section count, error severity, validation bits, record length, timestamp, platform id,
partition id, creator id, notification type, record id, flags, persistence info, reserved."""
CPER_SEVERITY = {0: 30, 1: 40, 2: 20, 3: 10}
"""UEFI error severity (0 recoverable, 1 fatal, 2 corrected, 3 informational) ->
nvmlOperationalEventSeverity_t."""
MAX_RECORDS_PER_GPU = 256
BUFFER_BYTES = 64 * 1024
MAX_BUFFER_BYTES = 4 << 20
CPER_MODULE = "CPER"
NAME = "cper_seen"
"""The state store's per-boot document of the record ids handled: ``{uuid: [id, ...]}``."""
MAX_SEEN = 1024
"""Record ids kept per GPU (the oldest go first)."""


@dataclass(frozen=True, slots=True)
class CperRecord:
    record_id: int
    severity: int
    """UEFI error severity (0 recoverable, 1 fatal, 2 corrected, 3 informational)."""
    flags: int
    """UEFI record flags: 1 recovered, 2 previous error, 4 simulated."""
    timestamp: datetime | None
    sections: int
    length: int


class CperError(ValueError):
    """Bytes that are not a CPER record."""


def _bcd(b: int) -> int:
    hi, lo = b >> 4, b & 0xF
    if hi > 9 or lo > 9:
        raise CperError("timestamp is not BCD")
    return hi * 10 + lo


def _timestamp(raw: bytes, valid: bool) -> datetime | None:
    if not valid or not any(raw):
        return None
    sec, minute, hour, _precise, day, month, year, century = raw
    try:
        return datetime(
            _bcd(century) * 100 + _bcd(year),
            _bcd(month),
            _bcd(day),
            _bcd(hour),
            _bcd(minute),
            _bcd(sec),
            tzinfo=UTC,
        )
    except (ValueError, CperError):
        return None


def parse_records(data: bytes) -> list[CperRecord]:
    """Every CPER record in ``data`` (records back to back); CperError on bad bytes."""
    out: list[CperRecord] = []
    pos = 0
    while pos < len(data):
        if len(data) - pos < HEADER.size:
            raise CperError(f"{len(data) - pos} trailing bytes: shorter than a record header")
        (
            sig, _rev, sig_end, sections, severity, valid, length, stamp,
            _platform, _partition, _creator, _notify, record_id, flags, _persist, _rsvd,
        ) = HEADER.unpack_from(data, pos)  # fmt: skip
        if sig != b"CPER" or sig_end != 0xFFFFFFFF:
            raise CperError(f"no CPER signature at byte {pos}")
        if length < HEADER.size or pos + length > len(data):
            raise CperError(f"record length {length} at byte {pos} does not fit")
        out.append(
            CperRecord(
                record_id=record_id,
                severity=severity,
                flags=flags,
                timestamp=_timestamp(stamp, bool(valid & 0x2)),
                sections=sections,
                length=length,
            )
        )
        pos += length
    return out


def build_record(
    record_id: int,
    severity: int,
    flags: int = 0,
    at: datetime | None = None,
    body: bytes = b"",
) -> bytes:
    """A CPER record with the UEFI header (for the fake NVML, tests and the bench)."""

    def bcd(v: int) -> int:
        return (v // 10) << 4 | (v % 10)

    stamp = b"\0" * 8
    valid = 0
    if at is not None:
        valid = 0x2
        stamp = bytes(
            [bcd(at.second), bcd(at.minute), bcd(at.hour), 1, bcd(at.day), bcd(at.month),
             bcd(at.year % 100), bcd(at.year // 100)]
        )  # fmt: skip
    z = b"\0" * 16
    head = HEADER.pack(
        b"CPER", 0x0101, 0xFFFFFFFF, 0, severity, valid, HEADER.size + len(body), stamp,
        z, z, z, z, record_id, flags, 0, b"\0" * 12,
    )  # fmt: skip
    return head + body


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
        one store transaction per observation (the engine driver's joins it, as it does for a
        kernel-log position)."""
        for obs in observations:
            with self._transaction():
                sink(obs)
                if obs.uuid and (obs.group_cursor or obs.via == "cper"):  # live 0: no group
                    self._add(obs.uuid, obs.group_cursor)

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
    """Reads every GPU's CPER records (in the NVML system thread) into observations."""

    def __init__(
        self, nvml: Any, counters: Counters, store: CperSeen, now: Callable[[], datetime]
    ) -> None:
        self._nvml = nvml
        self._counters = counters
        self._store = store
        self._now = now
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
                ):
                    self.available = False  # the driver has no CPER read (before R615)
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
                out.append(
                    OperationalEventObservation(
                        source="nvml",
                        at=r.timestamp or self._now(),
                        uuid=uuid,
                        module=CPER_MODULE,
                        code=0,
                        category=0,
                        severity=CPER_SEVERITY.get(r.severity, 0),
                        group_attributes=r.flags & 0x7,
                        group_cursor=r.record_id,
                        via="cper",
                    )
                )
        return out
