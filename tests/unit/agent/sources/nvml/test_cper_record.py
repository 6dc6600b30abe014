"""The CPER decoder against records laid out as NVIDIA's driver writes them, its bad input (every
length checked: counted, never raised past :class:`CperError`), and hypothesis over garbage.

The golden record below is packed field by field from the definitions, independently of
:func:`build_record`:

- UEFI specification, appendix N: the record header (N.2.1, 128 bytes: ``CPER``, revision,
  0xFFFFFFFF, section count, severity, validation bits, record length, BCD timestamp, four
  GUIDs, record id, flags, persistence info, 12 reserved bytes) and the section descriptor
  (N.2.2, 72 bytes).
- NVIDIA's open GPU kernel modules 615.71.09: ``gpu_cper.h``
  (``NV_CPER_SECTION_NVIDIA_EVENT_GUID`` 9068e568-6ca0-11f0-aeaf-159343591eac;
  ``NV_CPER_NV_EVENT_HEADER``: version 1, context count, source device type 1 = GPU, reserved,
  event type, event sub-type, trace id, 16-byte module signature; ``NV_CPER_NV_GPU_EVENT_INFO``
  1.0 = 0x0100, 16 bytes; ``NV_CPER_NV_EVENT_CONTEXT_HEADER`` 16 bytes, contexts padded to 16);
  ``op_event_log_entry.c`` (one section per event: event type = the category, sub-type = the
  module event code; record id = the group cursor; a FATAL event is written RECOVERABLE);
  ``gpu_cper.c`` (the legacy Xid context: the Xid, then its message).
- OpenBMC libcper ``cper-section-nvidia-events.h``: the legacy Xid context's data format type
  0x8001 (GPU-specific types have bit 15 set, ``gpu_cper.h``), GPU event info 2.0 (R620+) with
  the event scope in byte 7.
"""

from __future__ import annotations

import struct
import uuid
from contextlib import suppress
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.agent.sources.nvml.cper_record import (
    MAX_SECTIONS,
    CperError,
    build_record,
    nvidia_section,
    parse_records,
    parse_section,
)

NVIDIA = uuid.UUID("9068e568-6ca0-11f0-aeaf-159343591eac").bytes_le
PCIE = uuid.UUID("d995e954-bbc1-430f-ad91-b44dcb3c6f35").bytes_le  # UEFI N.2.7, not NVIDIA's
RECOVERABLE, FATAL, CORRECTED, INFORMATIONAL = 0, 1, 2, 3
CURSOR = (0x1234_5678_9A << 15) | 0x0042  # microseconds since the decade << 15 | sequence
AT = datetime(2026, 11, 26, 12, 34, 56, tzinfo=UTC)
MSG = "GPU has fallen off the bus."


def golden_xid79() -> bytes:
    """GPU-BUS 0x0003 (Xid 79, category INTERCONNECT_ERROR) as R615 renders its group."""
    xid = struct.pack("<I", 79) + MSG.encode() + b"\0"
    ctx_size = (16 + len(xid) + 15) // 16 * 16
    context = struct.pack("<IHHHHI", ctx_size, 0, 0, 0x8001, 0x0100, len(xid)) + xid
    context += b"\0" * (ctx_size - len(context))
    section = (
        struct.pack("<BBBBHHQ16s", 1, 1, 1, 0, 0x0003, 0x0003, 0xABCD, b"GPU-BUS")
        + struct.pack("<HBBHHQ", 0x0100, 16, 2, 0, 0, 0x1122334455667788)
        + context
    )
    offset = 128 + 72
    descriptor = struct.pack(
        "<IIHBBI16s16sI20s", offset, len(section), 0x0100, 1, 0, 1, NVIDIA,
        uuid.UUID("e1d3a8c0-0000-4000-8000-000000000001").bytes_le, RECOVERABLE, b"",
    )  # fmt: skip
    stamp = bytes([0x56, 0x34, 0x12, 1, 0x26, 0x11, 0x26, 0x20])
    z = b"\0" * 16
    header = struct.pack(
        "<4sHIHIII8s16s16s16s16sQIQ12s", b"CPER", 0x0104, 0xFFFFFFFF, 1, RECOVERABLE, 0x2,
        offset + len(section), stamp, z, z, z, z, CURSOR, 0, 0, b"\0" * 12,
    )  # fmt: skip
    return header + descriptor + section


def test_a_record_as_the_r615_driver_renders_it() -> None:
    (r,) = parse_records(golden_xid79())
    assert (r.record_id, r.severity, r.flags, r.sections, r.malformed) == (
        CURSOR, RECOVERABLE, 0, 1, 0,
    )  # fmt: skip
    assert r.timestamp == AT
    (e,) = r.events
    assert (e.module, e.category, e.code, e.legacy_xid, e.severity, e.scope, e.trace_id) == (
        "GPU-BUS", 3, 3, 79, RECOVERABLE, 0, 0xABCD,
    )  # fmt: skip


def test_the_writer_lays_records_out_as_the_driver() -> None:
    """What the fake NVML serves is the golden layout (the FRU id, flags and info ids aside)."""
    ours = build_record(
        CURSOR,
        RECOVERABLE,
        0,
        AT,
        sections=[(nvidia_section("GPU-BUS", 3, 3, legacy_xid=79, xid_message=MSG), 0)],
    )
    (a,), (b,) = parse_records(ours), parse_records(golden_xid79())
    assert (a.record_id, a.severity, a.timestamp, a.length) == (
        b.record_id, b.severity, b.timestamp, b.length,
    )  # fmt: skip
    assert (a.events[0].module, a.events[0].code, a.events[0].legacy_xid) == ("GPU-BUS", 3, 79)


def test_a_group_of_several_events_unused_slots_and_other_sections() -> None:
    sections = [
        (nvidia_section("GPU-RAS", 2, 0x30), CORRECTED),
        (nvidia_section("GPU-NVLINK", 3, 0x0004, info_version=0x0200, scope=0), RECOVERABLE),
    ]
    rec = bytearray(build_record(9, RECOVERABLE, 4, sections=sections))
    (r,) = parse_records(bytes(rec))
    assert [(e.module, e.code, e.severity) for e in r.events] == [
        ("GPU-RAS", 0x30, CORRECTED), ("GPU-NVLINK", 4, RECOVERABLE),
    ]  # fmt: skip
    assert r.flags == 4 and r.malformed == 0
    rec[128 + 16 : 128 + 32] = b"\0" * 16  # the first descriptor: an unused slot
    rec[128 + 72 + 16 : 128 + 72 + 32] = PCIE  # the second: another section type
    (r,) = parse_records(bytes(rec))
    assert r.events == () and r.malformed == 0


def test_parse_records_back_to_back() -> None:
    data = build_record(1, 0, 1) + build_record(2, 3, 4, body=b"abc")
    a, b = parse_records(data)
    assert (a.record_id, a.severity, a.flags, b.record_id, b.flags, b.length) == (
        1,
        0,
        1,
        2,
        4,
        131,
    )


def test_info_2_0_carries_the_events_scope() -> None:
    e = parse_section(nvidia_section("GPU-RAS", 2, 0x30, info_version=0x0200, scope=1), 0)
    assert e.scope == 1
    # 1.0's bytes 4-7 are the (reserved) partition ids: never read as a scope
    raw = bytearray(nvidia_section("GPU-RAS", 2, 0x30))
    raw[32 + 7] = 1
    assert parse_section(bytes(raw), 0).scope == 0


def _xid_record() -> bytearray:
    return bytearray(
        build_record(5, 0, sections=[(nvidia_section("GPU-BUS", 3, 3, legacy_xid=79), 0)])
    )


SEC = 128 + 72  # where the only section starts
CTX = SEC + 32 + 16  # where its context starts


def _put(fmt: str, at: int, *values: int) -> bytearray:
    rec = _xid_record()
    struct.pack_into(fmt, rec, at, *values)
    return rec


@pytest.mark.parametrize(
    ("name", "rec"),
    [
        ("section past the record", _put("<I", 128, 10_000)),
        ("section inside the descriptors", _put("<I", 128, 130)),
        ("section longer than the record", _put("<I", 132, 10_000)),
        ("event header version 2", _put("<B", SEC, 2)),
        ("a CPU's event", _put("<B", SEC + 2, 0)),
        ("info size past the section", _put("<B", SEC + 32 + 2, 250)),
        ("info size below its header", _put("<B", SEC + 32 + 2, 1)),
        ("more contexts than there are", _put("<B", SEC + 1, 3)),
        ("context size below its header", _put("<I", CTX, 8)),
        ("context size past the section", _put("<I", CTX, 4096)),
        ("data size over the context", _put("<I", CTX + 12, 64)),
        ("legacy Xid context of 2 bytes", _put("<I", CTX + 12, 2)),
        ("legacy Xid 0", _put("<I", CTX + 16, 0)),
        ("legacy Xid out of range", _put("<I", CTX + 16, 70_000)),
        ("descriptor table past the record", _put("<H", 6 + 4, 40)),
        ("more sections than a group holds", _put("<H", 6 + 4, MAX_SECTIONS + 1)),
    ],
)  # fmt: skip
def test_a_malformed_nvidia_section_is_counted_and_the_record_kept(
    name: str, rec: bytearray
) -> None:
    (r,) = parse_records(bytes(rec))
    assert r.record_id == 5 and r.events == () and r.malformed == 1, name


@pytest.mark.parametrize(
    "data",
    [
        b"CPER",
        b"XXXX" + build_record(1, 0)[4:],
        build_record(1, 0)[:-1],
        build_record(1, 0) + b"\0",
        bytes(_put("<I", 20, 100)),  # record length below the header
    ],
)
def test_bytes_that_are_not_records(data: bytes) -> None:
    with pytest.raises(CperError):
        parse_records(data)


def _check(records: list) -> None:  # type: ignore[type-arg]
    for r in records:
        assert len(r.events) <= MAX_SECTIONS
        for e in r.events:
            assert len(e.module) <= 16 and e.module.isprintable()
            assert e.legacy_xid is None or 1 <= e.legacy_xid <= 1023
            assert 0 <= e.category <= 0xFFFF and 0 <= e.code <= 0xFFFF


@given(st.binary(max_size=2048))
def test_fuzz_any_bytes(data: bytes) -> None:
    with suppress(CperError):
        _check(parse_records(data))


@given(
    st.lists(st.tuples(st.integers(0, 511), st.integers(0, 255)), min_size=1, max_size=24),
    st.integers(0, 600),
)
def test_fuzz_a_real_record_mutated_and_cut(flips: list[tuple[int, int]], cut: int) -> None:
    """A group of two events with a legacy Xid each, bytes overwritten and the tail cut."""
    rec = bytearray(
        build_record(
            7,
            0,
            sections=[
                (nvidia_section("GPU-BUS", 3, 3, legacy_xid=79, xid_message=MSG), 0),
                (nvidia_section("GPU-RAS", 2, 0x3D, legacy_xid=185, info_version=0x200), 0),
            ],
        )
    )
    for at, value in flips:
        rec[at % len(rec)] = value
    data = bytes(rec[: len(rec) - cut % len(rec)])
    with suppress(CperError):
        _check(parse_records(data))


@given(st.binary(min_size=8, max_size=8))
def test_fuzz_the_timestamp(stamp: bytes) -> None:
    rec = bytearray(build_record(5, 2))
    rec[16] = 2  # timestamp valid
    rec[24:32] = stamp
    (r,) = parse_records(bytes(rec))
    assert r.record_id == 5
