"""The codec's contract: any input either decodes to a valid message or raises ProtocolError."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth.protocol import (
    MAX_FRAME_BYTES,
    Ack,
    Condition,
    Error,
    ErrorCode,
    Event,
    Heartbeat,
    Hello,
    ProtocolError,
    decode,
    encode,
)
from gpuhealth.protocol.codec import decode_agent, decode_controller

AT = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)


def _event(seq: int = 1) -> Event:
    return Event(
        seq=seq,
        node="node-a",
        at=AT,
        kind="transition",
        gpu_uuid="GPU-1",
        gpu_index=0,
        previous="healthy",
        current="unhealthy",
        conditions=[Condition(reason="XidError", code="xid-79", severity="unhealthy", xid=79)],
        xid=79,
    )


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048))
def test_arbitrary_bytes_only_raise_protocol_error(data: bytes) -> None:
    for fn in (decode, decode_agent, decode_controller):
        try:
            fn(data)
        except ProtocolError as exc:
            assert exc.code in {"malformed", "too-large"}


_msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["hello", "snapshot", "event", "heartbeat", "ack", "error", "nope"]),
    st.dictionaries(
        st.sampled_from(
            [
                "seq",
                "node",
                "stream_id",
                "boot_id",
                "agent_version",
                "at",
                "kind",
                "gpu_uuid",
                "gpu_index",
                "previous",
                "current",
                "usage",
                "gpus",
                "code",
                "taken_at",
                "xid",
            ]
        ),
        _msgpack_values,
        max_size=10,
    ),
)
def test_structured_garbage_only_raises_protocol_error(tag: str, fields: dict[str, object]) -> None:
    data = msgspec.msgpack.encode({"type": tag, **fields})
    try:
        decode(data)
    except ProtocolError as exc:
        assert exc.code == "malformed"


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=2**63 - 1), st.binary(min_size=0, max_size=64))
def test_truncated_and_mutated_frames(seq: int, noise: bytes) -> None:
    frame = encode(_event(seq))
    for cut in (1, len(frame) // 2, len(frame) - 1):
        with pytest.raises(ProtocolError):
            decode(frame[:cut])
    mutated = bytearray(frame)
    for i, b in enumerate(noise):
        mutated[(i * 7) % len(mutated)] ^= b
    with contextlib.suppress(ProtocolError):
        decode(bytes(mutated))


def test_round_trip_every_message() -> None:
    msgs = [
        Hello(seq=1, node="n", stream_id="s", boot_id="b", agent_version="v"),
        _event(),
        Heartbeat(seq=3, node="n", at=AT),
        Ack(seq=0),
        Error(code=ErrorCode.REPLACED, message="x"),
    ]
    for m in msgs:
        assert decode(encode(m)) == m


def test_bounds_are_enforced() -> None:
    too_long_node = msgspec.msgpack.encode({"type": "ack", "seq": -1})
    with pytest.raises(ProtocolError):
        decode(too_long_node)
    with pytest.raises(ProtocolError) as info:
        decode(b"\x00" * (MAX_FRAME_BYTES + 1))
    assert info.value.code == "too-large"
    bad_seq = msgspec.msgpack.encode(
        {"type": "heartbeat", "seq": 0, "node": "n", "at": AT.isoformat()}
    )
    with pytest.raises(ProtocolError):
        decode_agent(bad_seq)
    wrong_direction = encode(Ack(seq=1))
    with pytest.raises(ProtocolError):
        decode_agent(wrong_direction)
