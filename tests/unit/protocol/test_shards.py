"""The shard header and the per-shard URL: what a replica's not_owner 503 names, read by the
agent (a garbage value is an error the agent ignores, never a crash or a wrong shard)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.protocol import ProtocolError
from gpuhealth.protocol.shards import MAX_SHARDS, shard_from_header, shard_url


@pytest.mark.parametrize(
    ("value", "count", "shard"),
    [
        (None, 4, None),  # absent: not known there, the agent keeps its own
        ("0", 4, 0),
        ("3", 4, 3),
        (" 2 ", 4, 2),
        ("007", 8, 7),
        ("0", 1, 0),
        (str(MAX_SHARDS - 1), MAX_SHARDS, MAX_SHARDS - 1),
    ],
)
def test_a_shard_header_names_a_shard(value: str | None, count: int, shard: int | None) -> None:
    assert shard_from_header(value, count) == shard


@pytest.mark.parametrize(
    ("value", "count"),
    [
        ("4", 4),  # one past the last shard
        ("1", 1),
        ("-1", 4),
        ("+1", 4),
        ("", 4),
        ("1.0", 4),
        ("one", 4),
        ("\u0663", 4),  # ARABIC-INDIC DIGIT THREE: a digit, but not the decimal we send
        ("9" * 40, 4),
        ("1, 2", 4),
    ],
)
def test_a_garbage_shard_header_is_a_protocol_error(value: str, count: int) -> None:
    with pytest.raises(ProtocolError, match="Gpuhealth-Shard"):
        shard_from_header(value, count)


@given(value=st.text(max_size=40), count=st.integers(1, MAX_SHARDS))
def test_any_header_is_a_shard_of_count_or_a_protocol_error(value: str, count: int) -> None:
    try:
        shard = shard_from_header(value, count)
    except ProtocolError:
        return
    assert shard is not None and 0 <= shard < count


@pytest.mark.parametrize(
    ("template", "shard", "url"),
    [
        (
            "wss://gh-controller-shard-{shard}.ns.svc:8443/v1/stream",
            7,
            "wss://gh-controller-shard-7.ns.svc:8443/v1/stream",
        ),
        ("ws://127.0.0.1:1/s{shard}/v1/stream", 0, "ws://127.0.0.1:1/s0/v1/stream"),
        (
            "wss://gh-controller.ns.svc:8443/v1/stream",
            3,
            "wss://gh-controller.ns.svc:8443/v1/stream",
        ),
        ("ws://{shard}.x/{shard}", 2, "ws://2.x/2"),
    ],
)
def test_the_url_of_a_shard(template: str, shard: int, url: str) -> None:
    assert shard_url(template, shard) == url
