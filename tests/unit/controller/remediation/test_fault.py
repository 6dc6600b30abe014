"""Fault identity, the action a verdict calls for, and retention (pure)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import msgspec
import pytest

from gpuhealth.controller.remediation.facts import NodeFacts
from gpuhealth.controller.remediation.fault import (
    SHARED_DOMAIN,
    choose_action,
    episode_name,
    expected_spec,
    expired,
    failed_gpus,
    fingerprint,
    propose,
    scoped_action,
    verify,
)
from gpuhealth.controller.remediation.model import Action, Episode, FaultGpu, Phase, initial_status
from gpuhealth.protocol import Condition
from tests.fakes.remediation_world import KEYS, T0, fault_condition, node_facts
from tests.support.remediation import settings

XID48 = fault_condition("xid-48", "RESET_GPU")


def fg(action: str, code: str = "c", since_s: float = 0, scope: str = "") -> FaultGpu:
    return FaultGpu(
        uuid="GPU-1",
        index=0,
        code=code,
        action=action,
        since=T0 + timedelta(seconds=since_s),
        scope=scope,
    )


def test_fingerprint_is_stable_and_covers_every_part() -> None:
    a, b = fg("RESET_GPU", "xid-48"), replace_gpu(fg("RESET_GPU", "ecc-dbe"), "GPU-2", 1)
    fp = fingerprint("n", "boot", [a, b])
    assert fp == fingerprint("n", "boot", [b, a]) and len(fp) == 16
    assert fp != fingerprint("m", "boot", [a, b])
    assert fp != fingerprint("n", "boot2", [a, b])
    assert fp != fingerprint(
        "n", "boot", [a, replace_gpu(fg("RESET_GPU", "ecc-dbe", 1), "GPU-2", 1)]
    )


def replace_gpu(g: FaultGpu, uuid: str, index: int) -> FaultGpu:
    return msgspec.structs.replace(g, uuid=uuid, index=index)


def test_episode_names_are_valid_and_unique_for_long_node_names() -> None:
    long_a = "a" * 250 + ".x"
    long_b = "a" * 250 + ".y"
    na = episode_name(long_a, fingerprint(long_a, "b", []))
    nb = episode_name(long_b, fingerprint(long_b, "b", []))
    assert len(na) <= 253 and len(nb) <= 253 and na != nb
    assert episode_name("node-a", "0123456789abcdef") == "node-a-0123456789abcdef"


@pytest.mark.parametrize(
    ("actions", "want"),
    [
        (["RESET_GPU"], "reset-gpu"),
        (["RESET_GPU", "RESTART_BM"], "reboot"),
        (["RESTART_VM"], "reboot"),
        (["RESET_GPU", "CONTACT_SUPPORT"], "escalate"),
        (["CHECK_COOLING"], "escalate"),
        (["RESET_GPU", "INVESTIGATE"], None),  # one GPU the loop cannot handle: a person
        (["RUN_DIAGNOSTICS"], "reset-gpu"),  # a blamed GPU: reset, validated with the diagnostic
        ([], None),
    ],
)
def test_action_is_the_strongest_and_unknown_actions_start_nothing(
    actions: list[str], want: str | None
) -> None:
    assert choose_action([fg(a) for a in actions], settings()) == want


def test_primary_condition_is_the_oldest_at_the_gpus_severity() -> None:
    first = fault_condition("xid-79", "RESTART_BM", since=T0)
    later = fault_condition("gpu-lost", "RESTART_BM", since=T0 + timedelta(seconds=5))
    degraded = Condition(
        reason="Thermal",
        code="thermal",
        severity="degraded",
        action="CHECK_COOLING",
        since=T0 - timedelta(hours=1),
    )
    n = node_facts(unhealthy={1: first})
    gpus = list(n.gpus)
    gpus[1] = replace(gpus[1], conditions=(later, degraded, first))
    (only,) = failed_gpus(replace(n, gpus=tuple(gpus)))
    assert (only.index, only.code, only.since) == (1, "xid-79", T0)


@pytest.mark.parametrize(
    ("node", "cfg", "reason"),
    [
        (node_facts(unhealthy={0: XID48}), settings(enabled=False), "RemediationDisabled"),
        (
            node_facts(unhealthy={0: XID48}, labels={KEYS.opt_out_label: "disabled"}),
            settings(),
            "OptedOut",
        ),
        (replace(node_facts(unhealthy={0: XID48}), reporting="silent"), settings(), "NoVerdict"),
        (
            node_facts(unhealthy={0: XID48}, labels={KEYS.exclude_label: "true"}),
            settings(),
            "Excluded",
        ),
        (node_facts(), settings(), "NoNewFault"),
        (
            node_facts(unhealthy={0: fault_condition("xid-x", "INVESTIGATE")}),
            settings(),
            "NoAction",
        ),
    ],
)
def test_propose_says_why_nothing_starts(node: NodeFacts, cfg: object, reason: str) -> None:
    p = propose(node, [], cfg, KEYS, T0)  # type: ignore[arg-type]
    assert p.spec is None and p.reason == reason


def finished_episode(phase: Phase, at_s: float, quarantined: bool = True) -> Episode:
    n = node_facts(unhealthy={0: XID48})
    spec = expected_spec(
        "node-a", "boot-1", failed_gpus(n), detected_at=T0, history=(), settings=settings()
    )
    assert spec is not None
    at = T0 + timedelta(seconds=at_s)
    st = initial_status(T0)
    times = msgspec.structs.replace(
        st.times,
        quarantined=T0 if quarantined else None,
        returned=at if phase is Phase.RETURNED else None,
        failed=at if phase is Phase.FAILED else None,
        escalated=at if phase is Phase.ESCALATED else None,
    )
    return Episode(
        name=f"e-{phase.value}-{quarantined}",
        spec=spec,
        status=msgspec.structs.replace(st, phase=phase, times=times),
    )


def test_retention_keeps_everything_that_holds_a_node() -> None:
    old = [
        finished_episode(Phase.RETURNED, 0),
        finished_episode(Phase.FAILED, 0, quarantined=False),
        finished_episode(Phase.FAILED, 0, quarantined=True),
        finished_episode(Phase.ESCALATED, 0),
    ]
    gone = expired(old, T0 + timedelta(days=31), 30 * 86400)
    assert sorted(e.name for e in gone) == ["e-Failed-False", "e-Returned-True"]
    assert expired(old, T0 + timedelta(days=29), 30 * 86400) == []
    # An operator took the quarantine away (removed by hand, or excluded): it holds nothing.
    given_up = finished_episode(Phase.FAILED, 0, quarantined=True)
    given_up = msgspec.structs.replace(
        given_up, status=msgspec.structs.replace(given_up.status, reason="QuarantineRemoved")
    )
    assert expired([given_up], T0 + timedelta(days=31), 30 * 86400) == [given_up]


def test_an_unresolved_escalation_stops_new_episodes_on_its_node() -> None:
    """Escalated means stopped: the same fault seen again (a new first-seen time) starts no
    second episode, so no second reset, until an operator resolves the escalation (release:
    re-validated and Returned, or deleted); other nodes are not affected."""
    later = fault_condition("xid-48", "RESET_GPU", T0 + timedelta(hours=1))
    again = node_facts(unhealthy={0: later})
    escalated = finished_episode(Phase.ESCALATED, 0)
    p = propose(again, [escalated], settings(), KEYS, T0 + timedelta(hours=1))
    assert p.spec is None and p.reason == "Escalated"
    resolved = finished_episode(Phase.RETURNED, 0)
    assert propose(again, [resolved], settings(), KEYS, T0 + timedelta(hours=1)).spec is not None


@pytest.mark.parametrize(
    ("reason", "quarantined", "blocks"),
    [
        ("Aborted", True, True),  # an operator's abort keeps the quarantine: held
        ("SpecMismatch", True, True),
        ("QuarantineRemoved", True, False),  # the operator took the node back
        ("Excluded", True, False),
        ("Aborted", False, False),  # ended before the quarantine: nothing held
    ],
)
def test_an_episode_that_ended_keeping_its_quarantine_stops_new_episodes(
    reason: str, quarantined: bool, blocks: bool
) -> None:
    """A Failed episode that keeps the node quarantined holds the node like an escalation: the
    next fault starts no episode (no drain, no reset) until an operator releases (re-validates)
    or deletes it. Before, the next fault started one on the held node."""
    later = fault_condition("xid-48", "RESET_GPU", T0 + timedelta(hours=1))
    again = node_facts(unhealthy={0: later})
    ended = finished_episode(Phase.FAILED, 0, quarantined=quarantined)
    ended = msgspec.structs.replace(
        ended, status=msgspec.structs.replace(ended.status, reason=reason)
    )
    p = propose(again, [ended], settings(), KEYS, T0 + timedelta(hours=1))
    assert (p.spec is None, p.reason) == ((True, "QuarantineHeld") if blocks else (False, ""))


@pytest.mark.parametrize(
    ("action", "scope", "want"),
    [
        ("reset-gpu", "", "reset-gpu"),
        ("reboot", "", "reboot"),
        ("reboot", "gpu", "reboot"),
        ("reboot", "node", "reboot"),
        ("reset-gpu", "nvlink-domain", "escalate"),
        ("reboot", "nvlink-domain", "escalate"),
        ("escalate", "nvlink-domain", "escalate"),
        ("reboot", "gpu-instance", "reset-gpu"),
        ("reboot", "compute-instance", "reset-gpu"),
        ("reset-gpu", "gpu-instance", "reset-gpu"),
        ("escalate", "compute-instance", "escalate"),
        ("reboot", "some-new-scope", "reboot"),
    ],
)
def test_the_scope_bounds_the_action(action: Action, scope: str, want: Action) -> None:
    assert scoped_action(action, scope) == want


@pytest.mark.parametrize(
    ("gpus", "want"),
    [
        ([fg("RESET_GPU", scope="nvlink-domain")], "escalate"),
        ([fg("RESTART_BM", scope="gpu-instance")], "reset-gpu"),
        ([fg("RESTART_BM", scope="gpu-instance"), fg("RESTART_BM")], "reboot"),
        ([fg("RESTART_BM", scope="compute-instance"), fg("RESET_GPU", scope="gpu")], "reset-gpu"),
        ([fg("INVESTIGATE", scope="nvlink-domain")], None),  # a person decides, as before
    ],
)
def test_the_strongest_scoped_action(gpus: list[FaultGpu], want: str | None) -> None:
    assert choose_action(gpus, settings()) == want


def _scoped(action: str, scope: str) -> Condition:
    return Condition(
        reason="OperationalEvent",
        code="op-event",
        severity="unhealthy",
        action=action,
        since=T0,
        scope=scope,
    )


@pytest.mark.parametrize(
    ("condition", "action", "reason"),
    [
        (_scoped("RESET_GPU", "nvlink-domain"), "escalate", SHARED_DOMAIN),
        (_scoped("RESTART_BM", "nvlink-domain"), "escalate", SHARED_DOMAIN),
        (_scoped("RESTART_BM", "gpu-instance"), "reset-gpu", ""),
        (_scoped("RESTART_BM", "gpu"), "reboot", ""),
        (_scoped("RESET_GPU", "gpu"), "reset-gpu", ""),
    ],
)
def test_a_scoped_condition_proposes_its_bounded_action_and_verifies(
    condition: Condition, action: str, reason: str
) -> None:
    node = node_facts(unhealthy={2: condition})
    p = propose(node, [], settings(), KEYS, T0)
    assert p.spec is not None
    assert (p.spec.action, p.spec.fault.escalation_reason) == (action, reason)
    assert p.spec.fault.gpus[0].scope == condition.scope
    ep = Episode(name=p.name, uid="u", spec=p.spec, status=initial_status(T0), created=T0)
    assert verify(ep, node, [], settings()) is None
    # the agent reporting another scope for the same condition: the spec no longer verifies
    other = msgspec.structs.replace(condition, scope="compute-instance")
    assert verify(ep, node_facts(unhealthy={2: other}), [], settings()) is not None


def test_a_shared_domain_fault_with_escalation_disabled_starts_nothing() -> None:
    """The domain incident (its taint, hold and alert) is then the whole answer."""
    node = node_facts(unhealthy={0: _scoped("RESET_GPU", "nvlink-domain")})
    cfg = settings(escalate=msgspec.structs.replace(settings().escalate, enabled=False))
    p = propose(node, [], cfg, KEYS, T0)
    assert p.spec is None and p.reason == "ActionDisabled"
