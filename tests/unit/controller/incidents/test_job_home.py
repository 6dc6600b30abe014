"""Past one process, where a job is decided (``controller/incidents/job_home.py``) and what
the judge decides within a replica's jobs and nodes (``blame.judge``'s scope), table-tested."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest

from gpuhealth.controller.incidents.blame import UNKNOWN_JOB, JobAttempt, Judgement, judge
from gpuhealth.controller.incidents.job_home import JobHome, goes_home, home_shard
from gpuhealth.protocol.shards import shard_of
from tests.unit.controller.incidents.test_blame import BAD, JOBSET, NOW, S, attempt, restarts

COUNT = 3
HOME = home_shard(JOBSET, COUNT)
OTHER = (HOME + 1) % COUNT


@pytest.mark.parametrize(
    ("job", "owned", "goes"),
    [
        (None, frozenset(), None),  # no pod on the GPU: the GPU's own rules only
        (UNKNOWN_JOB, frozenset(), None),  # allocations unknown: never a job's
        (JOBSET, frozenset({HOME}), None),  # homed here
        (JOBSET, frozenset({OTHER}), HOME),  # homed elsewhere: sent home
        (JOBSET, frozenset({OTHER, HOME}), None),
        (JOBSET, frozenset(), HOME),  # a replica between shards still sends it home
    ],
)
def test_what_goes_home(job: str | None, owned: frozenset[int], goes: int | None) -> None:
    assert goes_home(job, owned, COUNT) == goes


def test_the_home_is_the_nodes_hash_of_the_job_key() -> None:
    jobs = [f"ml/JobSet/train-{i}" for i in range(60)]
    assert [home_shard(j, COUNT) for j in jobs] == [shard_of(j, COUNT) for j in jobs]
    assert {home_shard(j, COUNT) for j in jobs} == set(range(COUNT))  # jobs spread


def test_job_home_reads_the_shards_owned_now() -> None:
    owned = {OTHER}
    home = JobHome(COUNT, lambda: frozenset(owned), lambda _node: True)
    assert not home.decides(JOBSET) and home.away(JOBSET) == HOME
    owned.add(HOME)  # took the home shard over
    assert home.decides(JOBSET) and home.away(JOBSET) is None


def _nodes(names: set[str]) -> Callable[[str], bool]:
    return lambda n: n in names


EVERY = {f"node-{i}" for i in range(16)}
FIRST_HALF = {f"node-{i}" for i in range(8)}  # node-3, the first to fault, is here
SECOND_HALF = EVERY - FIRST_HALF


def foreign_of(reports: list, owns: set[str]) -> tuple[JobAttempt, ...]:  # type: ignore[type-arg]
    return judge(reports, NOW, S, decides=lambda _j: True, owns=_nodes(owns)).foreign


@dataclass(frozen=True)
class Scope:
    name: str
    decides: bool
    owns: set[str]
    remote: Callable[[], tuple[JobAttempt, ...]]
    jobs: list[str]
    blamed: list[str]
    suspected: list[str]
    foreign: int
    """Attempts first faulting on a node not owned (sent to its owner)."""


NONE: Callable[[], tuple[JobAttempt, ...]] = tuple
SCOPES = [
    Scope("one process: everything", True, EVERY, NONE, [JOBSET], [BAD], [], 0),
    Scope(
        "home owner without the first-faulting node: the incident, no blame, 3 sent",
        True,
        SECOND_HALF,
        NONE,
        [JOBSET],
        [],
        [],
        3,
    ),
    Scope(
        "a node's owner, not the home: nothing of the job's", False, FIRST_HALF, NONE, [], [], [], 0
    ),
    Scope(
        "the node's owner counts the home's 3 attempts: blamed",
        False,
        FIRST_HALF,
        lambda: foreign_of(restarts(3), SECOND_HALF),
        [],
        [BAD],
        [],
        0,
    ),
    Scope(
        "two remote attempts: suspected",
        False,
        FIRST_HALF,
        lambda: foreign_of(restarts(3), SECOND_HALF)[:2],
        [],
        [],
        [BAD],
        0,
    ),
    Scope(
        "remote attempts on a node not owned here count for nothing",
        False,
        SECOND_HALF,
        lambda: foreign_of(restarts(3), SECOND_HALF),
        [],
        [],
        [],
        0,
    ),
    Scope(
        "remote attempts gone out of the window count for nothing",
        False,
        FIRST_HALF,
        lambda: tuple(
            replace(a, first_at=a.first_at - S.gpu_window_s, last_at=a.last_at - S.gpu_window_s)
            for a in foreign_of(restarts(3), SECOND_HALF)
        ),
        [],
        [],
        [],
        0,
    ),
]


@pytest.mark.parametrize("case", SCOPES, ids=[c.name for c in SCOPES])
def test_what_a_replica_decides_within_its_scope(case: Scope) -> None:
    """A 16-node JobSet restarting 3 times, node-3's GPU 5 first each time (the one-process
    verdict: blamed), judged by a replica owning ``owns`` and homing the job or not."""
    j = judge(
        restarts(3),
        NOW,
        S,
        decides=lambda _job: case.decides,
        owns=_nodes(case.owns),
        remote=case.remote(),
    )
    assert [f.job for f in j.jobs if f.xid_class == "app-abort"] == case.jobs
    assert [g.key for g in j.gpus if not g.suspected] == case.blamed
    assert [g.key for g in j.gpus if g.suspected] == case.suspected
    assert len(j.foreign) == case.foreign
    assert all(not case.owns or a.node not in case.owns for a in j.foreign)


def test_the_home_and_the_nodes_owner_together_decide_what_one_process_decides() -> None:
    """Split at any node, the home's job incident and the blames of both owners are the one
    process's, each once."""
    reports = [
        *restarts(3),
        *(r for i in range(2) for r in attempt(NOW - 300 - i * 600, first=(12, 1), job="ml/Job/b")),
    ]
    whole = judge(reports, NOW, S)
    for cut in range(17):
        mine = {f"node-{i}" for i in range(cut)}
        theirs = EVERY - mine
        home = judge(reports, NOW, S, owns=_nodes(mine))  # decides every job
        other = judge(
            reports, NOW, S, decides=lambda _j: False, owns=_nodes(theirs), remote=home.foreign
        )
        assert home.jobs == whole.jobs and other.jobs == ()
        assert _gpus(home) | _gpus(other) == _gpus(whole)
        assert not _gpus(home) & _gpus(other)


def _gpus(j: Judgement) -> set[tuple[str, bool]]:
    return {(g.key, g.suspected) for g in j.gpus}
