"""The one severity order of health states (protocol.HEALTH_STATES), for agent and controller."""

from __future__ import annotations

import itertools

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.protocol import HEALTH_STATES, severity, worst_state
from gpuhealth.protocol.codec import decode_agent, encode
from gpuhealth.protocol.v1 import (
    MAX_RETRY_AFTER_S,
    HealthState,
    Hello,
    retry_after_from_header,
    retry_after_header,
)


def test_order_is_healthy_degraded_unknown_unhealthy() -> None:
    assert HEALTH_STATES == ("healthy", "degraded", "unknown", "unhealthy")
    assert [severity(s) for s in HEALTH_STATES] == [0, 1, 2, 3]


def test_every_health_state_has_a_rank() -> None:
    assert set(HealthState.__args__) == set(HEALTH_STATES)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("states", "worst"),
    [
        ((), "healthy"),
        (("healthy", "healthy"), "healthy"),
        (("degraded", "healthy"), "degraded"),
        (("degraded", "unknown"), "unknown"),
        (("unknown", "unhealthy", "degraded"), "unhealthy"),
    ],
)
def test_worst_state(states: tuple[HealthState, ...], worst: str) -> None:
    assert worst_state(states) == worst


def test_worst_state_is_the_maximum_in_any_order() -> None:
    for combo in itertools.product(HEALTH_STATES, repeat=3):
        assert worst_state(combo) == max(combo, key=severity)
        assert worst_state(reversed(combo)) == worst_state(combo)


def test_an_unrecognised_state_ranks_as_unknown() -> None:
    assert severity("exploded") == severity("unknown")
    assert worst_state((), default="unknown") == "unknown"


def test_conditions_mig_instance_fields_are_additive() -> None:
    """A condition of 0.1 (no instance fields) still decodes, and a 0.1 peer (the same
    struct without them) reads a new one, ignoring the fields it does not know."""
    import msgspec

    from gpuhealth.protocol.v1 import Condition

    class OldCondition(msgspec.Struct, frozen=True, kw_only=True):
        reason: str
        code: str
        severity: str
        message: str = ""
        action: str = "NONE"
        xid: int | None = None

    old = msgspec.json.encode(OldCondition(reason="XidError", code="xid-95", severity="unhealthy"))
    assert msgspec.json.decode(old, type=Condition).gpu_instance is None
    new = Condition(
        reason="XidError", code="xid-95", severity="unhealthy", gpu_instance=5, compute_instance=1
    )
    assert msgspec.json.decode(msgspec.json.encode(new), type=OldCondition).code == "xid-95"
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(
            b'{"reason":"r","code":"c","severity":"healthy","gpu_instance":-1}', type=Condition
        )


def test_hello_capabilities_are_backward_compatible() -> None:
    """An agent older than the field sends no capabilities: unknown (None), never "none";
    a newer agent's names this version does not know are kept, not an error."""
    old = {"type": "hello", "seq": 1, "node": "n", "stream_id": "s", "boot_id": "b",
           "agent_version": "0.1"}  # fmt: skip
    assert msgspec.convert(old, Hello).capabilities is None
    new = Hello(seq=1, node="n", stream_id="s", boot_id="b", agent_version="0.2",
                capabilities=["reset-gpu", "validate", "teleport"])  # fmt: skip
    back = decode_agent(encode(new))
    assert isinstance(back, Hello) and back.capabilities == ["reset-gpu", "validate", "teleport"]
    none = Hello(seq=1, node="n", stream_id="s", boot_id="b", agent_version="0.2", capabilities=[])
    assert decode_agent(encode(none)).capabilities == []  # type: ignore[union-attr]


def test_error_retry_after_is_backward_compatible() -> None:
    """An agent older than ``retry_after_s`` decodes the controller's come-back-later Error
    as the rate-limited Error it knows (and backs off as after any refusal); a controller
    older than the field sends none."""
    from gpuhealth.protocol import Error, ErrorCode
    from gpuhealth.protocol.codec import decode_controller

    class OldError(msgspec.Struct, frozen=True, kw_only=True, tag="error"):
        code: str
        message: str = ""

    frame = encode(Error(code=ErrorCode.RATE_LIMITED, message="later", retry_after_s=12.5))
    old = msgspec.msgpack.decode(frame, type=OldError)
    assert old.code == "rate-limited" and old.message == "later"
    back = decode_controller(frame)
    assert isinstance(back, Error) and back.retry_after_s == 12.5
    without = decode_controller(encode(Error(code=ErrorCode.RATE_LIMITED)))
    assert isinstance(without, Error) and without.retry_after_s is None
    with pytest.raises(Exception, match="retry_after_s"):  # bounded, like every field
        decode_controller(encode(Error(code=ErrorCode.RATE_LIMITED, retry_after_s=1e9)))


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("8", 8.0),
        (" 8 ", 8.0),
        ("0", 0.0),
        ("99999", MAX_RETRY_AFTER_S),  # bounded like the Error frame's field
        (None, None),
        ("", None),
        ("-1", None),
        ("1.5", None),  # delta-seconds are whole
        ("1e3", None),
        ("٣", None),  # a digit, but not ASCII
        ("Wed, 21 Oct 2026 07:28:00 GMT", None),  # an HTTP-date: backed off as a failure
        ("9" * 400, None),
    ],
)
def test_retry_after_header_parsing(value: str | None, seconds: float | None) -> None:
    assert retry_after_from_header(value) == seconds


@given(st.floats(min_value=0.0, max_value=MAX_RETRY_AFTER_S, allow_nan=False))
def test_a_told_delay_is_never_shortened_by_the_header(seconds: float) -> None:
    told = retry_after_from_header(retry_after_header(seconds))
    assert told is not None and seconds <= told and told - seconds <= 1.0
