"""The Snapshot's NIC ports (protocol v1, added in 0.4): bounded like every field, a round trip
keeps them, older peers on either side interoperate, and fuzzed ports only ever decode or are
refused as malformed."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth.protocol import NicPortInfo, ProtocolError, Snapshot
from gpuhealth.protocol.codec import decode_agent, encode
from gpuhealth.protocol.frames import MAX_FRAME_BYTES
from gpuhealth.protocol.v1 import MAX_NIC_GPUS, MAX_NIC_PORTS, MAX_RAIL_VERDICTS

AT = datetime(2026, 11, 22, 10, 0, 0, tzinfo=UTC)
PORT = NicPortInfo(
    device="mlx5_0",
    port=1,
    link_layer="InfiniBand",
    port_state="ACTIVE",
    phys_state="LinkUp",
    rate_gbps=400.0,
    expected_rate_gbps=400.0,
    model="MT4129",
    gpus=["GPU-0", "GPU-1"],
    affinity="PIX",
    flaps=3,
    last_flap=AT,
    verdicts=["rail-flapping"],
)


def _snapshot(nics: list[NicPortInfo]) -> Snapshot:
    return Snapshot(seq=7, node="gpu-node-7", taken_at=AT, nics=nics)


def test_a_round_trip_keeps_the_ports() -> None:
    bond = NicPortInfo(device="mlx5_bond_0", port=1, link_layer="Ethernet", netdev="bond0")
    snap = _snapshot([PORT, bond])
    assert decode_agent(encode(snap)) == snap


def test_a_full_node_of_ports_is_small() -> None:
    """64 ports with every string at its bound, 8 GPUs behind each (NVML's UUIDs), every
    verdict: under 64 KiB; with every list and string at its bound, under a frame's limit."""
    codes = ["rail-down", "rail-flapping", "rail-degraded-rate", "rail-errors"]
    assert len(codes) == MAX_RAIL_VERDICTS
    big = NicPortInfo(
        device="d" * 64,
        port=255,
        link_layer="x" * 32,
        port_state="x" * 32,
        phys_state="x" * 32,
        rate_gbps=400.0,
        expected_rate_gbps=400.0,
        netdev="x" * 32,
        model="x" * 128,
        affinity="x" * 32,
        gpus=[f"GPU-{i:08x}-1111-2222-3333-444455556666" for i in range(8)],
        flaps=2**31 - 1,
        last_flap=AT,
        verdicts=codes,
    )
    assert len(encode(_snapshot([big] * MAX_NIC_PORTS))) < 64 * 1024
    widest = msgspec.structs.replace(big, gpus=["G" * 253] * MAX_NIC_GPUS)
    assert len(encode(_snapshot([widest] * MAX_NIC_PORTS))) < MAX_FRAME_BYTES


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("device", ""),
        ("device", "d" * 65),
        ("port", -1),
        ("port", 256),
        ("rate_gbps", -1.0),
        ("rate_gbps", 1e9),
        ("flaps", -1),
        ("gpus", ["G"] * (MAX_NIC_GPUS + 1)),
        ("gpus", [""]),
        ("verdicts", ["rail-down"] * (MAX_RAIL_VERDICTS + 1)),
        ("verdicts", ["Not A Label"]),
        ("netdev", "n" * 33),
        ("port_state", "x" * 33),
    ],
)
def test_bounds_are_enforced(field: str, value: object) -> None:
    port = {**msgspec.to_builtins(PORT), field: value}
    frame = msgspec.msgpack.encode({**msgspec.to_builtins(_snapshot([])), "nics": [port]})
    with pytest.raises(ProtocolError):
        decode_agent(frame)


def test_too_many_ports_are_refused() -> None:
    frame = msgspec.msgpack.encode(
        {**msgspec.to_builtins(_snapshot([])), "nics": [msgspec.to_builtins(PORT)] * 65}
    )
    with pytest.raises(ProtocolError):
        decode_agent(frame)


def test_older_peers_interoperate() -> None:
    """An older controller (its Snapshot without ``nics``) reads a new agent's Snapshot,
    ignoring the ports; a new controller reads an older agent's Snapshot as no ports."""

    class OldSnapshot(msgspec.Struct, frozen=True, kw_only=True, tag="snapshot"):
        seq: int
        node: str
        taken_at: datetime

    old = msgspec.msgpack.decode(encode(_snapshot([PORT])), type=OldSnapshot)
    assert old.node == "gpu-node-7"
    new = decode_agent(msgspec.msgpack.encode(OldSnapshot(seq=1, node="n", taken_at=AT)))
    assert isinstance(new, Snapshot) and new.nics == []


_values = (
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats()
    | st.text(max_size=80)
    | st.lists(st.text(max_size=10), max_size=3)
)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            ["device", "port", "link_layer", "port_state", "phys_state", "rate_gbps",
             "expected_rate_gbps", "netdev", "model", "gpus", "affinity", "flaps", "last_flap",
             "verdicts", "unknown_field"]
        ),
        _values,
        max_size=14,
    ),
    st.integers(min_value=0, max_value=3),
)  # fmt: skip
def test_fuzzed_ports_decode_or_are_malformed(fields: dict[str, Any], copies: int) -> None:
    frame = msgspec.msgpack.encode(
        {**msgspec.to_builtins(_snapshot([])), "nics": [fields] * copies}
    )
    try:
        snap = decode_agent(frame)
    except ProtocolError as exc:
        assert exc.code == "malformed"
    else:
        assert isinstance(snap, Snapshot) and len(snap.nics) == copies
        for p in snap.nics:
            assert 1 <= len(p.device) <= 64 and 0 <= p.port <= 255
