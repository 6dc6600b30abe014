"""The fleet_scale bench's pure parts: each agent's own source address, the largest N."""

from __future__ import annotations

import resource

import pytest

from bench import bench_fleet_scale
from bench.fleet_scale_agents import source_address


def test_every_agent_has_its_own_loopback_address() -> None:
    addresses = [source_address(n) for n in range(20_000)]
    assert len(set(addresses)) == 20_000
    for a in addresses:
        octets = [int(x) for x in a.split(".")]
        assert octets[0] == 127 and all(1 <= x <= 254 for x in octets[1:])


@pytest.mark.parametrize(
    ("hard", "expected"),
    [(20_000, 19_000), (1_048_576, 20_000), (7_500, 6_000), (4_096, bench_fleet_scale.SMALL)],
)
def test_the_largest_n_leaves_room_below_the_fd_limit(
    monkeypatch: pytest.MonkeyPatch, hard: int, expected: int
) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _what: (1024, hard))
    assert bench_fleet_scale.largest_n() == expected
