"""The outbox's on-disk record format (see :mod:`gpuhealth.agent.stream.outbox`), pure functions.

Each record is ``<type u8><seq u64><length u32><crc32 u32><payload>`` (little-endian; the CRC
covers type, seq, length and payload). :func:`parse_log` replays a log image and stops at the
first record that is short, fails its CRC, has an unknown type or does not decode.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from enum import IntEnum
from typing import Literal

from gpuhealth.protocol import MAX_FRAME_BYTES, Event, Heartbeat, ProtocolError, Snapshot
from gpuhealth.protocol.codec import decode_agent
from gpuhealth.protocol.remediation import ActionReport

Kind = Literal["event", "heartbeat", "snapshot", "report"]
OutboxMessage = Event | Heartbeat | Snapshot | ActionReport

_HEADER = struct.Struct("<BQII")
_CRC_PREFIX = struct.Struct("<BQI")


class RecordType(IntEnum):
    EVENT = 1
    HEARTBEAT = 2
    SNAPSHOT = 3
    ACK = 4
    DROP = 5
    SEQ = 6
    REPORT = 7
    """A remediation action report (kept like an event: never dropped, fsync'd)."""


KIND_OF: dict[RecordType, Kind] = {
    RecordType.EVENT: "event",
    RecordType.HEARTBEAT: "heartbeat",
    RecordType.SNAPSHOT: "snapshot",
    RecordType.REPORT: "report",
}
TYPE_OF: dict[Kind, RecordType] = {v: k for k, v in KIND_OF.items()}


def encode_record(rtype: RecordType, seq: int, payload: bytes = b"") -> bytes:
    crc = zlib.crc32(payload, zlib.crc32(_CRC_PREFIX.pack(rtype, seq, len(payload))))
    return _HEADER.pack(rtype, seq, len(payload), crc) + payload


@dataclass(frozen=True, slots=True)
class Entry:
    seq: int
    kind: Kind
    frame: bytes


@dataclass(slots=True)
class Loaded:
    entries: dict[int, Entry]
    acked: int
    high: int
    records: int
    good_bytes: int
    corrupt: bool


def parse_log(data: bytes) -> Loaded:
    """Replay a log image; stops at the first bad record (everything after it is discarded)."""
    entries: dict[int, Entry] = {}
    acked = high = records = 0
    off = 0
    corrupt = False
    while off < len(data):
        if len(data) - off < _HEADER.size:
            corrupt = True
            break
        rtype_raw, seq, length, crc = _HEADER.unpack_from(data, off)
        end = off + _HEADER.size + length
        if (
            length > MAX_FRAME_BYTES
            or end > len(data)
            or rtype_raw not in RecordType._value2member_map_
        ):
            corrupt = True
            break
        payload = data[off + _HEADER.size : end]
        if zlib.crc32(payload, zlib.crc32(_CRC_PREFIX.pack(rtype_raw, seq, length))) != crc:
            corrupt = True
            break
        rtype = RecordType(rtype_raw)
        if rtype in KIND_OF:
            try:
                decode_agent(payload)
            except ProtocolError:
                corrupt = True
                break
            if seq > acked:
                entries[seq] = Entry(seq, KIND_OF[rtype], payload)
        elif rtype is RecordType.ACK:
            acked = max(acked, seq)
            for s in [s for s in entries if s <= acked]:
                del entries[s]
        elif rtype is RecordType.DROP:
            entries.pop(seq, None)
        high = max(high, seq)
        records += 1
        off = end
    return Loaded(entries, acked, high, records, off, corrupt)
