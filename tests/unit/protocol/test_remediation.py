"""Remediation orders and reports: any input decodes to a valid message or ProtocolError;
valid messages round-trip; the tags join v1's unions without a collision."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth.protocol import MAX_FRAME_BYTES, ProtocolError
from gpuhealth.protocol.remediation import (
    ActionReport,
    CancelOrder,
    CheckResult,
    GpuProcess,
    Order,
    RebootOrder,
    ResetGpuOrder,
    ValidateOrder,
    decode_order,
    decode_report,
    encode,
)
from gpuhealth.protocol.v1 import AgentMessage, ControllerMessage

AT = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
OID = "0123456789abcdef-reset-gpu-1"


def orders() -> list[Order]:
    common = {"seq": 1, "order_id": OID, "episode": "node-a-0123456789abcdef", "issued_at": AT}
    return [
        ResetGpuOrder(**common, deadline_s=120, gpus=["GPU-1"]),
        RebootOrder(**common, deadline_s=120, expected_boot_id="b1", reason="r"),
        ValidateOrder(
            **common,
            deadline_s=600,
            gpus=["GPU-1"],
            signals=["xid-48"],
            soak_s=300,
            diagnostic=True,
        ),
        CancelOrder(**common, cancel_order_id="0123456789abcdef-validate-1"),
    ]


def report(**kw: object) -> ActionReport:
    base: dict[str, object] = {
        "seq": 7,
        "node": "node-a",
        "order_id": OID,
        "episode": "e",
        "action": "reset-gpu",
        "state": "refused",
        "at": AT,
        "reason": "gpu-busy",
        "processes": [GpuProcess(gpu_uuid="GPU-1", pid=42, name="python")],
        "checks": [CheckResult(name="nvml", passed=True)],
    }
    return ActionReport(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize("order", orders(), ids=lambda o: type(o).__name__)
def test_orders_round_trip(order: Order) -> None:
    assert decode_order(encode(order)) == order


def test_report_round_trips() -> None:
    r = report()
    assert decode_report(encode(r)) == r


@pytest.mark.parametrize(
    "bad",
    [
        {"order_id": "UPPER-case"},
        {"order_id": "x" * 65},
        {"gpus": []},
        {"gpus": ["GPU"] * 65},
        {"deadline_s": 0},
        {"seq": 0},
    ],
)
def test_order_bounds(bad: dict[str, object]) -> None:
    raw = msgspec.to_builtins(orders()[0])
    raw.update(bad)
    with pytest.raises(ProtocolError) as exc:
        decode_order(msgspec.msgpack.encode({"type": "order-reset-gpu", **raw}))
    assert exc.value.code == "malformed"


@pytest.mark.parametrize(
    "bad",
    [
        {"state": "done"},
        {"reason": "Not-A-Code"},
        {"processes": [{"gpu_uuid": "g", "pid": -1}]},
        {"checks": [{"name": "c", "passed": True}] * 65},
    ],
)
def test_report_bounds(bad: dict[str, object]) -> None:
    raw = msgspec.to_builtins(report())
    raw.update(bad)
    with pytest.raises(ProtocolError):
        decode_report(msgspec.msgpack.encode({"type": "action-report", **raw}))


def test_oversized_frame_is_refused() -> None:
    with pytest.raises(ProtocolError) as exc:
        decode_report(b"\x00" * (MAX_FRAME_BYTES + 1))
    assert exc.value.code == "too-large"


def test_tags_join_the_v1_unions() -> None:
    """Phase 2 adds these types to the codec's unions: msgspec accepts the combined unions
    (it rejects duplicate tags) and routes each frame to its type."""
    to_agent = msgspec.msgpack.Decoder(ControllerMessage | Order)  # type: ignore[operator]
    to_controller = msgspec.msgpack.Decoder(AgentMessage | ActionReport)  # type: ignore[operator]
    for o in orders():
        assert to_agent.decode(encode(o)) == o
    assert to_controller.decode(encode(report())) == report()


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048))
def test_arbitrary_bytes_only_raise_protocol_error(data: bytes) -> None:
    for fn in (decode_order, decode_report):
        with contextlib.suppress(ProtocolError):
            fn(data)


_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=80)
    | st.binary(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=20), inner, max_size=5)
    ),
    max_leaves=30,
)
_fields = [
    "type",
    "seq",
    "order_id",
    "episode",
    "issued_at",
    "deadline_s",
    "gpus",
    "expected_boot_id",
    "signals",
    "soak_s",
    "diagnostic",
    "cancel_order_id",
    "node",
    "action",
    "state",
    "at",
    "reason",
    "message",
    "processes",
    "checks",
    "boot_id",
]
_tags = st.sampled_from(
    [
        "order-reset-gpu",
        "order-reboot",
        "order-validate",
        "order-cancel",
        "action-report",
        "hello",
        "x",
    ]
)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(_fields), _values, max_size=12), _tags)
def test_structured_garbage_only_raises_protocol_error(doc: dict[str, object], tag: str) -> None:
    data = msgspec.msgpack.encode({**doc, "type": tag})
    for fn in (decode_order, decode_report):
        try:
            msg = fn(data)
        except ProtocolError as exc:
            assert exc.code == "malformed"
        else:  # anything that decodes is a valid, bounded message
            assert (
                decode_order(encode(msg)) == msg
                if fn is decode_order
                else decode_report(encode(msg)) == msg
            )
