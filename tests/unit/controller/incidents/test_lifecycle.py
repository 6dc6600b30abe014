"""On-call's lifecycle of an incident (pure), table-tested: what a new occurrence inherits,
which actions are new, what pages."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpuhealth.controller.incidents.lifecycle import (
    Lifecycle,
    ObservedLifecycle,
    OnCallAction,
    Seen,
    in_effect,
    observe,
    on_open,
    paging,
    resolution,
)

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
NOW = T0 + timedelta(hours=1)
ACK = OnCallAction("alice", T0, "on it")
ACK2 = OnCallAction("bob", T0 + timedelta(minutes=5), "mine")
SILENCE = OnCallAction("alice", T0, "rack swap", until=T0 + timedelta(hours=2))
SILENCE_PAST = OnCallAction("alice", T0, "rack swap", until=T0 + timedelta(minutes=30))
RESOLVE = OnCallAction("carol", T0, "fixed")
L, Ob = Lifecycle, ObservedLifecycle


def seen(a: OnCallAction, applied: bool = True) -> Seen:
    return Seen(a.at, applied, T0)


@pytest.mark.parametrize(
    ("name", "lifecycle", "before", "new", "after"),
    [
        ("nothing", Lifecycle(), ObservedLifecycle(), (), ObservedLifecycle()),
        (
            "an ack is new",
            Lifecycle(acknowledged=ACK),
            ObservedLifecycle(),
            ("acknowledged",),
            ObservedLifecycle(acknowledged=Seen(ACK.at, True, NOW)),
        ),
        (
            "seen before: not new",
            Lifecycle(acknowledged=ACK),
            ObservedLifecycle(acknowledged=seen(ACK)),
            (),
            ObservedLifecycle(acknowledged=seen(ACK)),
        ),
        (
            "another ack (another at) is new",
            Lifecycle(acknowledged=ACK2),
            ObservedLifecycle(acknowledged=seen(ACK)),
            ("acknowledged",),
            ObservedLifecycle(acknowledged=Seen(ACK2.at, True, NOW)),
        ),
        (
            "from the previous occurrence: stays not applied",
            Lifecycle(resolved=RESOLVE),
            ObservedLifecycle(resolved=seen(RESOLVE, applied=False)),
            (),
            ObservedLifecycle(resolved=seen(RESOLVE, applied=False)),
        ),
        (
            "an unacknowledge is forgotten",
            Lifecycle(),
            ObservedLifecycle(acknowledged=seen(ACK)),
            (),
            ObservedLifecycle(),
        ),
        (
            "all three at once",
            Lifecycle(acknowledged=ACK, silenced=SILENCE, resolved=RESOLVE),
            ObservedLifecycle(),
            ("acknowledged", "silenced", "resolved"),
            ObservedLifecycle(
                acknowledged=Seen(ACK.at, True, NOW),
                silenced=Seen(SILENCE.at, True, NOW),
                resolved=Seen(RESOLVE.at, True, NOW),
            ),
        ),
    ],
)
def test_observe(
    name: str,
    lifecycle: Lifecycle,
    before: ObservedLifecycle,
    new: tuple[str, ...],
    after: ObservedLifecycle,
) -> None:
    assert observe(lifecycle, before, NOW) == (after, new), name


def test_a_new_occurrence_does_not_inherit_the_actions_of_the_last() -> None:
    lifecycle = Lifecycle(acknowledged=ACK, resolved=RESOLVE)
    observed = on_open(lifecycle, NOW)
    assert observed == ObservedLifecycle(
        acknowledged=Seen(ACK.at, False, NOW), resolved=Seen(RESOLVE.at, False, NOW)
    )
    assert observe(lifecycle, observed, NOW) == (observed, ())
    assert paging(lifecycle, observed, NOW) == "paging"
    assert in_effect(lifecycle, observed, "resolved") is None
    # on-call acknowledges this occurrence: a new action, in effect
    again = Lifecycle(acknowledged=ACK2, resolved=RESOLVE)
    observed, new = observe(again, observed, NOW)
    assert new == ("acknowledged",) and paging(again, observed, NOW) == "acknowledged"


@pytest.mark.parametrize(
    ("name", "lifecycle", "observed", "pages"),
    [
        ("nobody took it", L(), Ob(), "paging"),
        ("acknowledged", L(acknowledged=ACK), Ob(acknowledged=seen(ACK)), "acknowledged"),
        ("not seen yet", L(acknowledged=ACK), Ob(), "paging"),
        ("silenced", L(silenced=SILENCE), Ob(silenced=seen(SILENCE)), "silenced"),
        ("the silence ended", L(silenced=SILENCE_PAST), Ob(silenced=seen(SILENCE_PAST)), "paging"),
        (
            "silence ended, still acknowledged",
            L(acknowledged=ACK, silenced=SILENCE_PAST),
            Ob(acknowledged=seen(ACK), silenced=seen(SILENCE_PAST)),
            "acknowledged",
        ),
        (
            "silenced beats acknowledged",
            L(acknowledged=ACK, silenced=SILENCE),
            Ob(acknowledged=seen(ACK), silenced=seen(SILENCE)),
            "silenced",
        ),
        (
            "an ack from the last occurrence",
            L(acknowledged=ACK),
            Ob(acknowledged=seen(ACK, applied=False)),
            "paging",
        ),
    ],
)  # fmt: skip
def test_paging(name: str, lifecycle: Lifecycle, observed: ObservedLifecycle, pages: str) -> None:
    assert paging(lifecycle, observed, NOW) == pages, name


def test_resolution_says_who_and_why() -> None:
    assert resolution(RESOLVE) == "resolved by carol: fixed"
