"""The one-time import of the state files earlier agents wrote into the state store.

Before :mod:`gpuhealth.agent.state_store`, the state dir held six hand-written formats:
``outbox.log`` (an append-only log of CRC-framed records) with ``stream_id``,
``latched.json``, ``kmsg-position.json``, ``dcgm-xid.json`` and the NVML source's
``cper-seen.json`` (each a JSON document with the boot id it was written on) and
``remediation-orders.json`` (a JSON list). The first start of an agent with the store imports
whatever of them is there, in one transaction, then removes the files; an unreadable file is
logged and skipped (its earlier reader ignored it too), a torn tail of the outbox log ends it
(as its loader did). ``cper-seen.json`` came to the store after the others: a state dir whose
other files were imported already still has it imported once (its own ``meta`` mark).

The outbox log's records are ``<type u8><seq u64><length u32><crc32 u32><payload>``
(little-endian; the CRC covers type, seq, length and payload). :func:`parse_log` replays a
log image and stops at the first record that is short, fails its CRC, has an unknown type or
does not decode.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from gpuhealth.common.logging import get_logger
from gpuhealth.protocol import MAX_FRAME_BYTES, ProtocolError
from gpuhealth.protocol.codec import decode_agent

if TYPE_CHECKING:
    from gpuhealth.agent.state_store import Kind, StateStore

log = get_logger("agent.state")

OUTBOX_LOG = "outbox.log"
STREAM_ID = "stream_id"
BOOT_FILES = {
    "latched.json": ("latched", "latched", 1),
    "kmsg-position.json": ("kmsg_position", None, 1),
    "dcgm-xid.json": ("dcgm_xid", "last", 1),
    "cper-seen.json": ("cper_seen", "gpus", 2),
}
"""file -> (its boot_state name, the field holding the value (None: the rest of the file), the
import level that brings it)."""
IMPORTED = "legacy_imported"
LEVEL = 2
"""``meta[legacy_imported]``: 1, the files of the store's first version were imported; 2, and
``cper-seen.json``. A store at level 1 imports only what level 2 added (the files of level 1
were removed; one that could not be would be imported twice)."""
ORDERS = "remediation-orders.json"

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


def import_legacy_files(store: StateStore) -> None:
    """Import the earlier formats found in the store's state dir (once), then remove them."""
    try:
        done = int(store.meta(IMPORTED) or 0)
    except ValueError:
        done = LEVEL
    if done >= LEVEL:
        return
    found: list[Path] = []
    with store.transaction():
        if done < 1:
            _import_outbox(store, found)
        for name, (key, field, level) in BOOT_FILES.items():
            if level <= done:
                continue
            doc = _read_json(store.dir / name, found)
            if isinstance(doc, dict) and isinstance(doc.get("boot_id"), str):
                boot_id = doc.pop("boot_id")
                value = doc.get(field) if field is not None else doc
                store.put_boot_value(key, boot_id, msgspec.json.encode(value))
        if done < 1:
            orders = _read_json(store.dir / ORDERS, found)
            if isinstance(orders, list):
                for entry in orders:
                    if isinstance(entry, dict) and isinstance(entry.get("order_id"), str):
                        store.put_order(entry["order_id"], msgspec.json.encode(entry), len(orders))
        store.set_meta(IMPORTED, str(LEVEL))
    if store.meta(IMPORTED) != str(LEVEL):
        return  # not committed: the files stay for the next start
    for path in found:
        try:
            os.unlink(path)
        except OSError as exc:
            log.warning("state_legacy_file_not_removed", path=str(path), error=str(exc))
    if found:
        log.info("state_legacy_files_imported", files=sorted(p.name for p in found))


def _read_json(path: Path, found: list[Path]) -> Any:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("state_legacy_file_unreadable", path=str(path), error=str(exc))
        return None
    found.append(path)
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        log.warning("state_legacy_file_unreadable", path=str(path), error=str(exc))
        return None


def _import_outbox(store: StateStore, found: list[Path]) -> None:
    sid_path = store.dir / STREAM_ID
    try:
        sid = sid_path.read_text(encoding="ascii").strip()
        found.append(sid_path)
        if 0 < len(sid) <= 64:
            store.set_meta("stream_id", sid)
    except (OSError, UnicodeDecodeError):
        pass
    path = store.dir / OUTBOX_LOG
    try:
        data = path.read_bytes()
    except OSError:
        return
    found.append(path)
    loaded = parse_log(data)
    if loaded.corrupt:
        log.warning("outbox_corrupt_tail_truncated", path=str(path), offset=loaded.good_bytes)
    for seq in sorted(loaded.entries):
        e = loaded.entries[seq]
        store.outbox_put(seq, e.kind, e.frame)
    store.outbox_ack(loaded.acked)
    store.raise_meta("outbox_high", loaded.high)
