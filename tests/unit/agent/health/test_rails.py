"""The rail verdicts (pure): one port's polls through its tracker, the node's ports through the
book, table-driven; and counter sequences fuzzed: a reset is never growth, a flap is counted
once."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth.agent.health.rail_settings import RailSettings
from gpuhealth.agent.health.rails import (
    RAIL_SCOPE,
    RailBook,
    RailTracker,
    count_flaps,
    expected_rates,
)
from gpuhealth.agent.observations import NicObservation, NicPortSample
from tests.support.agent import gpu_address, port_up

AT = datetime(2026, 11, 22, 10, 0, 0, tzinfo=UTC)
GPU0, GPU1, GPU2 = (gpu_address(i) for i in range(3))
UP = port_up((0, 1))
DOWN = replace(UP, port_state="DOWN", phys_state="Polling")
UNREADABLE = replace(UP, port_state=None)


def counters(smp: NicPortSample, **values: int) -> NicPortSample:
    return replace(smp, counters={**smp.counters, **values})


def run(
    polls: Sequence[NicPortSample],
    s: RailSettings | None = None,
    *,
    every_s: float = 10.0,
    expected: float | None = 400.0,
) -> tuple[RailTracker, list[set[str]], int]:
    """Feed ``polls`` ``every_s`` apart; the tracker, the codes raised after each, resets."""
    t = RailTracker(s or RailSettings())
    seen: list[set[str]] = []
    resets = 0
    for i, smp in enumerate(polls):
        resets += t.update(smp, expected, 1000.0 + i * every_s, AT + timedelta(seconds=i * every_s))
        seen.append(set(t.raised))
    return t, seen, resets


# ---------------------------------------------------------------- flaps, one event once


@pytest.mark.parametrize(
    ("observed", "downed", "carry", "flaps", "carry_after"),
    [
        (False, None, 0, 0, 0),
        (True, None, 0, 1, 0),  # no counter: the poll's own eyes
        (True, 1, 0, 1, 0),  # seen and counted: one event
        (False, 2, 0, 2, 0),  # two flaps between polls, none seen
        (True, 2, 0, 2, 0),  # seen one, the counter shows another
        (True, 0, 0, 1, 1),  # seen; the counter lags: carried
        (False, 1, 1, 0, 0),  # ... and shows it the next poll: the same event
        (False, 2, 1, 1, 0),  # ... with one more nobody saw
        (True, 1, 1, 1, 1),  # the lagging one arrives while a new down is seen
        (False, 0, 1, 0, 0),  # a counter that never moves (RoCE): the carry ends
    ],
)
def test_count_flaps(
    observed: bool, downed: int | None, carry: int, flaps: int, carry_after: int
) -> None:
    assert count_flaps(observed, downed, carry) == (flaps, carry_after)


# ---------------------------------------------------------------- one port's verdicts


@pytest.mark.parametrize(
    ("polls", "after"),
    [
        ([UP, DOWN], [set(), set()]),  # one bad poll is noise
        ([UP, DOWN, DOWN], [set(), set(), {"rail-down"}]),  # the second raises it
        ([DOWN, DOWN, DOWN], [set(), set(), set()]),  # never up: an unused port
        ([UP, UNREADABLE, UNREADABLE, UNREADABLE], [set()] * 4),  # missing data: no verdict
        ([UP, DOWN, UNREADABLE, DOWN], [set(), set(), set(), {"rail-down"}]),
        ([UP, DOWN, DOWN, UP], [set(), set(), {"rail-down"}, {"rail-down"}]),  # clean window
    ],
)
def test_down_where_it_was_up(polls: list[NicPortSample], after: list[set[str]]) -> None:
    s = RailSettings(flap_threshold=100)  # only rail-down here
    assert run(polls, s)[1] == after


def test_down_clears_after_the_clean_window() -> None:
    t, _, _ = run([UP, DOWN, DOWN, UP], RailSettings(flap_threshold=100, clean_window_s=60))
    assert "rail-down" in t.raised
    assert not t.expire(1020.0 + 59, AT)  # 59 s after the last bad poll (at 1020 s)
    assert t.expire(1020.0 + 60, AT)
    assert t.raised == {}


def test_the_condition_names_the_port_and_keeps_its_first_words() -> None:
    s = RailSettings(flap_threshold=100, down_severity="unhealthy")
    t, _, _ = run([UP, DOWN, DOWN, DOWN], s)
    c = t.raised["rail-down"]
    assert (c.reason, c.severity, c.action, c.scope) == (
        "RailDown", "unhealthy", "CHECK_NETWORK", RAIL_SCOPE
    )  # fmt: skip
    assert c.message == "mlx5_0 port 1 (InfiniBand) is DOWN/Polling (it was ACTIVE/LinkUp)"
    assert c.since == AT + timedelta(seconds=20)  # raised at the third poll, kept since


@pytest.mark.parametrize(
    ("rate", "expected", "raised"),
    [
        (400.0, 400.0, False),
        (200.0, 400.0, True),  # a lane trained down
        (200.0, None, False),  # nothing to compare with
        (800.0, 400.0, False),  # faster is not a fault
    ],
)
def test_rate_below_the_expected(rate: float, expected: float | None, raised: bool) -> None:
    slow = replace(UP, rate_gbps=rate)
    t, _, _ = run([slow, slow, slow], expected=expected)
    assert ("rail-degraded-rate" in t.raised) is raised
    if raised:
        assert "200 Gb/s, below the expected 400 Gb/s" in t.raised["rail-degraded-rate"].message


def test_a_down_port_is_not_judged_on_its_rate() -> None:
    slow_down = replace(DOWN, rate_gbps=10.0)
    t, _, _ = run([UP, slow_down, slow_down, slow_down], RailSettings(flap_threshold=100))
    assert set(t.raised) == {"rail-down"}


def _errors(*symbol_errors: int) -> list[NicPortSample]:
    return [counters(UP, symbol_error=n) for n in symbol_errors]


@pytest.mark.parametrize(
    ("values", "raised"),
    [
        ((0, 4, 8, 12), False),  # 0.4/s, under 0.5/s
        ((0, 10, 20, 30), True),  # 1/s, three polls in a row
        ((0, 10, 10, 20), False),  # not two bad polls in a row
        ((0, 60000, 3, 6), False),  # a reset to 0 between: never a huge growth
        ((50000, 3, 7, 11), False),  # a reset, then quiet
    ],
)
def test_errors_rising_faster_than_their_rate(values: tuple[int, ...], raised: bool) -> None:
    t, _, _ = run(_errors(*values))
    assert ("rail-errors" in t.raised) is raised


def test_a_reset_counter_is_counted_and_never_judged() -> None:
    _, seen, resets = run(_errors(0, 65000, 2, 1, 3))
    assert resets == 2 and all("rail-errors" not in s for s in seen[:3])


def test_the_error_message_names_the_counter_and_its_threshold() -> None:
    t, _, _ = run(_errors(0, 100, 200, 300))
    assert t.raised["rail-errors"].message == (
        "mlx5_0 port 1 (InfiniBand): symbol_error rising 10/s (threshold 0.5/s)"
    )


def test_a_saturated_counter_is_not_judged() -> None:
    stuck = replace(counters(UP, symbol_error=65535), saturated=frozenset({"symbol_error"}))
    t, _, _ = run([counters(UP, symbol_error=60000), stuck, stuck, stuck])
    assert "rail-errors" not in t.raised


def test_a_counter_not_listed_is_not_judged() -> None:
    loud = [counters(UP, out_of_buffer=n) for n in (0, 10**6, 2 * 10**6, 3 * 10**6)]
    assert "rail-errors" not in run(loud)[0].raised
    s = RailSettings(error_rates_per_s={"out_of_buffer": 100.0})
    assert "rail-errors" in run(loud, s)[0].raised


@pytest.mark.parametrize(
    ("polls", "flaps", "raised"),
    [
        ([UP, counters(UP, link_downed=1), counters(UP, link_downed=1)], 1, False),
        ([UP, counters(UP, link_downed=2)], 2, True),  # two between polls, none seen
        ([UP, counters(DOWN, link_downed=1), counters(UP, link_downed=1),
          counters(DOWN, link_downed=2)], 2, True),  # seen and counted: once each
        ([UP, DOWN, UP, DOWN], 2, True),  # a counter that never moves: seen downs
        ([UP, counters(UP, link_downed=200), counters(UP, link_downed=3)], 200, True),  # reset
    ],
)  # fmt: skip
def test_flaps_within_the_window(polls: list[NicPortSample], flaps: int, raised: bool) -> None:
    t, _, _ = run(polls)
    assert t.flaps_total == flaps
    assert ("rail-flapping" in t.raised) is raised


def test_flapping_clears_when_the_flaps_age_out() -> None:
    s = RailSettings(flap_window_s=100.0, flap_threshold=2)
    t, _, _ = run([UP, counters(UP, link_downed=2), counters(UP, link_downed=2)], s)
    assert "rail-flapping" in t.raised and t.last_flap == AT + timedelta(seconds=10)
    assert not t.expire(1010.0 + 100.0, AT)  # the flaps at 1010 s are still in the window
    assert t.expire(1010.0 + 100.1, AT) and t.raised == {} and t.flap_count == 0
    assert t.flaps_total == 2


def test_an_operator_clear_starts_over() -> None:
    t, _, _ = run([UP, DOWN, DOWN, counters(DOWN, link_downed=3)])
    assert {"rail-down", "rail-flapping"} <= set(t.raised)
    assert t.clear() and t.raised == {} and t.flap_count == 0
    t.update(counters(DOWN, link_downed=3), 400.0, 1040.0, AT)
    assert t.raised == {}  # one bad poll again is noise again


# ---------------------------------------------------------------- counter sequences, fuzzed


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), st.integers(min_value=0, max_value=3), st.booleans()),
        min_size=1,
        max_size=40,
    )
)
def test_flaps_are_counted_once_and_resets_never_count(
    steps: list[tuple[bool, int, bool]],
) -> None:
    """A port's polls: up or down, 0-3 link-down events since the last poll (the counter grows
    by as many), sometimes reset to 0 by someone. Never more flaps than events plus seen downs,
    never fewer than the counter's growth, and a reset never adds."""
    s = RailSettings(flap_threshold=10**6, raise_after_samples=1)
    t = RailTracker(s)
    value, events, seen, grown = 0, 0, 0, 0
    was_up = True
    t.update(UP, 400.0, 0.0, AT)
    for i, (up, new, reset) in enumerate(steps, start=1):
        events += new
        if reset:
            value = 0
        else:
            value += new
            grown += new
        if was_up and not up:
            seen += 1
        was_up = up
        t.update(counters(UP if up else DOWN, link_downed=value), 400.0, float(i), AT)
    assert t.flaps_total <= events + seen
    assert t.flaps_total >= grown
    assert "rail-errors" not in t.raised and "rail-degraded-rate" not in t.raised


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=2**16 - 1), min_size=2, max_size=30))
def test_no_error_verdict_from_a_reset_alone(values: list[int]) -> None:
    """Symbol-error readings that only ever fall (every change is a reset) never raise."""
    falling = sorted(values, reverse=True)
    _, seen, resets = run(_errors(*falling), RailSettings(raise_after_samples=1))
    assert all("rail-errors" not in s for s in seen)
    assert resets == sum(1 for a, b in itertools.pairwise(falling) if b < a)


# ---------------------------------------------------------------- the node's ports


def test_expected_rate_is_the_model_setting_else_the_most_common() -> None:
    ports = [
        replace(UP, device=f"mlx5_{i}", rate_gbps=r) for i, r in enumerate((400, 400, 200))
    ] + [
        replace(UP, device="mlx5_9", rate_gbps=100.0, port_state="DOWN"),  # down: not counted
        replace(UP, device="mlx5_bond_0", link_layer="Ethernet", rate_gbps=200.0, model="MT4123"),
    ]
    got = expected_rates(ports, RailSettings())
    assert got[("mlx5_2", 1)] == 400.0 and got[("mlx5_bond_0", 1)] == 200.0
    pinned = expected_rates(ports, RailSettings(expected_rate_gbps={"MT4123": 400.0}))
    assert pinned[("mlx5_bond_0", 1)] == 400.0
    tie = [replace(UP, device="a", rate_gbps=400.0), replace(UP, device="b", rate_gbps=200.0)]
    assert expected_rates(tie, RailSettings()) == {("a", 1): None, ("b", 1): None}


def _obs(
    *ports: NicPortSample, unread: frozenset[str] = frozenset(), source: str = "rdma"
) -> NicObservation:
    return NicObservation(source=source, at=AT, ports=ports, unread=unread)  # type: ignore[arg-type]


def test_each_gpu_carries_its_ports_verdicts_merged() -> None:
    book = RailBook(RailSettings(flap_threshold=100))
    other = replace(UP, device="mlx5_1", gpus=(GPU1, GPU2))
    for i, (a, b) in enumerate([(UP, other), (DOWN, replace(other, port_state="DOWN")),
                                (DOWN, replace(other, port_state="DOWN"))]):  # fmt: skip
        book.apply(_obs(a, b), 1000.0 + 10 * i)
    conds = book.gpu_conditions()
    assert set(conds) == {GPU0, GPU1, GPU2}
    assert conds[GPU0]["rail-down"].message.startswith("mlx5_0 port 1")
    both = conds[GPU1]["rail-down"]
    assert "mlx5_0 port 1" in both.message and "; mlx5_1 port 1" in both.message
    assert conds[GPU2]["rail-down"].message.startswith("mlx5_1 port 1")


def test_a_port_gone_takes_its_verdicts_and_an_unread_one_keeps_them() -> None:
    book = RailBook(RailSettings(flap_threshold=100))
    for i, smp in enumerate((UP, DOWN, DOWN)):
        book.apply(_obs(smp), 1000.0 + 10 * i)
    assert GPU0 in book.gpu_conditions()
    v = book.version
    book.apply(_obs(unread=frozenset({"mlx5_0"})), 1030.0)  # its read hung: kept
    assert GPU0 in book.gpu_conditions() and book.version == v
    book.apply(_obs(), 1040.0)  # gone (hot-removed)
    assert book.gpu_conditions() == {} and book.statuses(lambda _: None) == []
    assert book.version == v + 1


def test_two_sources_own_their_own_ports() -> None:
    book = RailBook(RailSettings())
    book.apply(_obs(UP), 1000.0)
    book.apply(_obs(replace(UP, device="sim0"), source="sim"), 1000.0)
    book.apply(_obs(UP), 1010.0)  # the RDMA source's poll does not remove the simulator's
    assert [s.sample.device for s in book.statuses(lambda _: None)] == ["mlx5_0", "sim0"]


def test_the_version_moves_with_what_a_snapshot_says_not_with_counters() -> None:
    book = RailBook(RailSettings())
    book.apply(_obs(UP), 1000.0)
    v = book.version
    book.apply(_obs(counters(UP, symbol_error=3, port_rcv_errors=1)), 1010.0)
    assert book.version == v
    book.apply(_obs(replace(UP, rate_gbps=200.0)), 1020.0)
    assert book.version == v + 1


def test_clearing_a_gpu_starts_its_ports_over() -> None:
    book = RailBook(RailSettings(flap_threshold=100))
    other = replace(UP, device="mlx5_1", gpus=(GPU2,))
    for i, smp in enumerate((UP, DOWN, DOWN)):
        book.apply(_obs(smp, replace(other, port_state=smp.port_state)), 1000.0 + 10 * i)
    assert book.clear(GPU0)
    assert set(book.gpu_conditions()) == {GPU2}  # the other NIC's GPU keeps its verdict
    assert not book.clear(GPU0)
