"""CPER records as the NVIDIA driver writes them, read from untrusted bytes (pure).

A GPU's CPER log (``nvmlSystemGetCPER_v1``) holds one UEFI Common Platform Error Record per
GPU Operational Event group (UEFI specification, appendix N): the record header (N.2.1: the
record id, which is the group's cursor; severity; BCD timestamp; flags), one section
descriptor per event (N.2.2: offset, length, severity, the section type GUID) and, for each
event, NVIDIA's event section (NVIDIA's open GPU kernel modules, ``gpu_cper.h`` /
``gpu_cper.c``, 615.71.09: section type ``9068e568-6ca0-11f0-aeaf-159343591eac``):

- the event header, 32 bytes: version (1), context count, source device type (1: GPU),
  reserved, ``eventType`` (the event's category), ``eventSubType`` (its module event code),
  the trace id, the module signature (16 bytes, NUL-terminated ASCII);
- the GPU event info, ``size`` bytes (16): version (1.0 in R615; 2.0 from R620, whose byte 7
  is the event's scope, as OpenBMC's libcper ``cper-section-nvidia-events.h`` decodes it);
- ``context count`` contexts, each a 16-byte header (total size, a multiple of 16; version;
  data format type; data format version; data size) and its data. Data format ``0x8001``
  (GPU-specific types have bit 15 set) is the legacy Xid: a 32-bit Xid and its message.

Every length and offset is checked against the bytes at hand before it is used, every loop is
bounded (sections by :data:`MAX_SECTIONS`, contexts by the header's 8-bit count and their
sizes): bytes that are not a record raise :class:`CperError`; a record whose NVIDIA sections
cannot be decoded keeps its header and counts them in :attr:`CperRecord.malformed`.
:func:`build_record` and :func:`nvidia_section` write the same layout (the fake NVML, tests,
the bench).
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

HEADER = struct.Struct("<4sHIHIII8s16s16s16s16sQIQ12s")
"""UEFI CPER record header (UEFI spec, N.2.1), 128 bytes: signature, revision, signature end,
section count, error severity, validation bits, record length, timestamp, platform id,
partition id, creator id, notification type, record id, flags, persistence info, reserved."""
DESCRIPTOR = struct.Struct("<IIHBBI16s16sI20s")
"""UEFI section descriptor (N.2.2), 72 bytes: offset (from the record's start), length,
revision, validation bits, reserved, flags, section type, FRU id, severity, FRU text."""
EVENT_HEADER = struct.Struct("<BBBBHHQ16s")
"""NVIDIA event section header (``NV_CPER_NV_EVENT_HEADER``), 32 bytes."""
INFO_HEADER = struct.Struct("<HB")
"""The GPU event info's version and size (``NV_CPER_NV_GPU_EVENT_INFO``'s first fields)."""
CONTEXT_HEADER = struct.Struct("<IHHHHI")
"""``NV_CPER_NV_EVENT_CONTEXT_HEADER``, 16 bytes: context size (with header and padding),
version, reserved, data format type, data format version, data size."""
XID_CODE = struct.Struct("<I")

NVIDIA_EVENT_SECTION = uuid.UUID("9068e568-6ca0-11f0-aeaf-159343591eac").bytes_le
"""``NV_CPER_SECTION_NVIDIA_EVENT_GUID`` as an EFI_GUID is laid out (little-endian fields)."""
EVENT_HEADER_VERSION = 1
SOURCE_DEVICE_GPU = 1
INFO_SIZE = 16
INFO_SCOPE_SINCE_MAJOR = 2
"""GPU event info 2.0 (R620+): byte 7 is the event's scope (1.0: reserved partition ids)."""
INFO_SCOPE_OFFSET = 7
CONTEXT_LEGACY_XID = 0x8001
CONTEXT_ALIGN = 16
MAX_SECTIONS = 255
"""Events per group (the driver's groups fit an 8-bit group size)."""
MAX_XID = 1023
SIGNATURE_END = 0xFFFFFFFF
CPER_REVISION = 0x0104
"""The revision NVIDIA's CPER library writes (UEFI 2.10)."""
TIMESTAMP_VALID = 0x2


class CperError(ValueError):
    """Bytes that are not a CPER record."""


class SectionError(ValueError):
    """An NVIDIA event section that cannot be decoded."""


@dataclass(frozen=True, slots=True)
class CperSection:
    """One NVIDIA event section: one operational event of the record's group."""

    module: str
    category: int
    code: int
    severity: int
    """The section's UEFI error severity (the driver writes a FATAL event as RECOVERABLE: a
    fatal GPU is not a fatal host)."""
    legacy_xid: int | None = None
    scope: int = 0
    """The event's raw scope (GPU event info 2.0 and later; 0 before)."""
    trace_id: int = 0


@dataclass(frozen=True, slots=True)
class CperRecord:
    record_id: int
    severity: int
    """UEFI error severity (0 recoverable, 1 fatal, 2 corrected, 3 informational)."""
    flags: int
    """UEFI record flags: 1 recovered, 2 previous error, 4 simulated (from R620, the event
    group's attributes; R615 writes 0)."""
    timestamp: datetime | None
    sections: int
    length: int
    events: tuple[CperSection, ...] = ()
    """The NVIDIA event sections decoded, in descriptor order."""
    malformed: int = 0
    """NVIDIA event sections (or their contexts) that could not be decoded."""


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


def signature_text(raw: bytes) -> str:
    """A fixed-size ASCII field up to its NUL (or its end), printable characters only."""
    head = raw.split(b"\0", 1)[0]
    return "".join(chr(b) if 0x20 <= b < 0x7F else "?" for b in head)


def _legacy_xid(section: bytes, start: int, count: int) -> int | None:
    """The legacy Xid among the ``count`` contexts from ``start`` (None: none)."""
    pos, xid = start, None
    for _ in range(count):
        if pos + CONTEXT_HEADER.size > len(section):
            raise SectionError(f"context at {pos} past the section's {len(section)} bytes")
        size, _ver, _rsvd, fmt, _fmt_ver, data_size = CONTEXT_HEADER.unpack_from(section, pos)
        if size < CONTEXT_HEADER.size or pos + size > len(section):
            raise SectionError(f"context size {size} at {pos} does not fit")
        if data_size > size - CONTEXT_HEADER.size:
            raise SectionError(f"context data size {data_size} over its context's {size}")
        if fmt == CONTEXT_LEGACY_XID:
            if data_size < XID_CODE.size:
                raise SectionError(f"legacy Xid context of {data_size} bytes")
            (code,) = XID_CODE.unpack_from(section, pos + CONTEXT_HEADER.size)
            if not 1 <= code <= MAX_XID:
                raise SectionError(f"legacy Xid {code} out of range")
            xid = xid or code
        pos += size
    return xid


def parse_section(section: bytes, severity: int) -> CperSection:
    """One NVIDIA event section's bytes (``severity``: its descriptor's); SectionError when they
    are not one. A section whose contexts are broken raises too: its legacy Xid is unknown."""
    if len(section) < EVENT_HEADER.size + INFO_HEADER.size:
        raise SectionError(f"{len(section)} bytes: shorter than an event header and its info")
    version, contexts, device, _rsvd, category, code, trace, module = EVENT_HEADER.unpack_from(
        section
    )
    if version != EVENT_HEADER_VERSION:
        raise SectionError(f"event header version {version}")
    if device != SOURCE_DEVICE_GPU:
        raise SectionError(f"source device type {device} (not a GPU)")
    info_version, info_size = INFO_HEADER.unpack_from(section, EVENT_HEADER.size)
    if info_size < INFO_HEADER.size or EVENT_HEADER.size + info_size > len(section):
        raise SectionError(f"event info size {info_size} does not fit")
    scope = 0
    if info_version >> 8 >= INFO_SCOPE_SINCE_MAJOR and info_size > INFO_SCOPE_OFFSET:
        scope = section[EVENT_HEADER.size + INFO_SCOPE_OFFSET]
    return CperSection(
        module=signature_text(module),
        category=category,
        code=code,
        severity=severity,
        legacy_xid=_legacy_xid(section, EVENT_HEADER.size + info_size, contexts),
        scope=scope,
        trace_id=trace,
    )


def _sections(data: bytes, pos: int, length: int, count: int) -> tuple[list[CperSection], int]:
    """The NVIDIA event sections of the record at ``pos`` and how many were malformed."""
    table = HEADER.size + count * DESCRIPTOR.size
    if count > MAX_SECTIONS or table > length:
        return [], 1  # the descriptor table itself does not fit: nothing of it can be read
    out: list[CperSection] = []
    bad = 0
    for i in range(count):
        (offset, size, _rev, _valid, _rsvd, _flags, kind, _fru, severity, _text) = (
            DESCRIPTOR.unpack_from(data, pos + HEADER.size + i * DESCRIPTOR.size)
        )
        if kind != NVIDIA_EVENT_SECTION:
            continue  # an unused slot (null GUID) or another vendor's section
        if offset < table or offset + size > length:
            bad += 1
            continue
        try:
            out.append(parse_section(data[pos + offset : pos + offset + size], severity))
        except SectionError:
            bad += 1
    return out, bad


def parse_records(data: bytes) -> list[CperRecord]:
    """Every CPER record in ``data`` (records back to back); CperError on bytes that are not
    records (a record's malformed NVIDIA sections are counted in it, not raised)."""
    out: list[CperRecord] = []
    pos = 0
    while pos < len(data):
        if len(data) - pos < HEADER.size:
            raise CperError(f"{len(data) - pos} trailing bytes: shorter than a record header")
        (
            sig, _rev, sig_end, sections, severity, valid, length, stamp,
            _platform, _partition, _creator, _notify, record_id, flags, _persist, _rsvd,
        ) = HEADER.unpack_from(data, pos)  # fmt: skip
        if sig != b"CPER" or sig_end != SIGNATURE_END:
            raise CperError(f"no CPER signature at byte {pos}")
        if length < HEADER.size or pos + length > len(data):
            raise CperError(f"record length {length} at byte {pos} does not fit")
        events, malformed = _sections(data, pos, length, sections)
        out.append(
            CperRecord(
                record_id=record_id,
                severity=severity,
                flags=flags,
                timestamp=_timestamp(stamp, bool(valid & TIMESTAMP_VALID)),
                sections=sections,
                length=length,
                events=tuple(events),
                malformed=malformed,
            )
        )
        pos += length
    return out


# ----------------------------------------------------------------- writing (fake NVML, tests)


def _align(n: int) -> int:
    return (n + CONTEXT_ALIGN - 1) // CONTEXT_ALIGN * CONTEXT_ALIGN


def nvidia_section(
    module: str,
    category: int,
    code: int,
    *,
    legacy_xid: int | None = None,
    xid_message: str = "",
    info_version: int = 0x0100,
    scope: int = 0,
    trace_id: int = 0,
) -> bytes:
    """An NVIDIA event section's bytes as the driver writes them: event header, GPU event
    info (1.0 as R615 writes it; 2.0 with the scope), the legacy Xid context if any."""
    head = EVENT_HEADER.pack(
        EVENT_HEADER_VERSION,
        1 if legacy_xid else 0,
        SOURCE_DEVICE_GPU,
        0,
        category,
        code,
        trace_id,
        module.encode("ascii")[:16],
    )
    info = bytearray(INFO_SIZE)
    INFO_HEADER.pack_into(info, 0, info_version, INFO_SIZE)
    if info_version >> 8 >= INFO_SCOPE_SINCE_MAJOR:
        info[INFO_SCOPE_OFFSET] = scope
    ctx = b""
    if legacy_xid:
        data = XID_CODE.pack(legacy_xid) + xid_message.encode("ascii") + b"\0"
        size = _align(CONTEXT_HEADER.size + len(data))
        ctx = CONTEXT_HEADER.pack(size, 0, 0, CONTEXT_LEGACY_XID, 0x0100, len(data)) + data
        ctx += b"\0" * (size - len(ctx))
    return head + bytes(info) + ctx


def _bcd_byte(v: int) -> int:
    return (v // 10) << 4 | (v % 10)


def build_record(
    record_id: int,
    severity: int,
    flags: int = 0,
    at: datetime | None = None,
    *,
    body: bytes = b"",
    sections: Sequence[tuple[bytes, int]] = (),
) -> bytes:
    """A CPER record: the UEFI header, a descriptor per NVIDIA event section of ``sections``
    (its bytes, its UEFI severity) and their data, then ``body`` (raw bytes, for tests)."""
    stamp = b"\0" * 8
    valid = 0
    if at is not None:
        valid = TIMESTAMP_VALID
        stamp = bytes(
            [_bcd_byte(at.second), _bcd_byte(at.minute), _bcd_byte(at.hour), 1,
             _bcd_byte(at.day), _bcd_byte(at.month), _bcd_byte(at.year % 100),
             _bcd_byte(at.year // 100)]
        )  # fmt: skip
    offset = HEADER.size + len(sections) * DESCRIPTOR.size
    table, data = b"", b""
    for raw, sev in sections:
        table += DESCRIPTOR.pack(
            offset + len(data), len(raw), 0x0100, 0, 0, 0, NVIDIA_EVENT_SECTION, b"\0" * 16,
            sev, b"\0" * 20,
        )  # fmt: skip
        data += raw
    z = b"\0" * 16
    length = offset + len(data) + len(body)
    head = HEADER.pack(
        b"CPER", CPER_REVISION, SIGNATURE_END, len(sections), severity, valid, length, stamp,
        z, z, z, z, record_id, flags, 0, b"\0" * 12,
    )  # fmt: skip
    return head + table + data + body
