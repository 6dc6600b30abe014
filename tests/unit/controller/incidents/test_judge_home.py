"""Two replicas' judges past one process, each owning one shard's nodes, joined by the real
forwarders and routes' conversions (the bodies as they travel): a job on nodes of both shards
is decided by its home's judge alone, and the GPU first to fault on the other shard is blamed
by its node's judge from the attempts the home sent."""

from __future__ import annotations

from dataclasses import replace

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from gpuhealth.controller.fleet.model import Fleet
from gpuhealth.controller.incidents.blame import JobAttempt, XidOccurrence
from gpuhealth.controller.incidents.forwarder import HandoffForwarder
from gpuhealth.controller.incidents.handoff import (
    ATTEMPTS_PATH,
    AttemptBatch,
    HandoffMetrics,
    XidBatch,
    received_attempt,
    received_xid,
)
from gpuhealth.controller.incidents.job_home import JobHome, home_shard
from gpuhealth.controller.incidents.judge import IncidentJudge
from gpuhealth.controller.incidents.model import IncidentBook
from gpuhealth.controller.incidents.settings import JudgeSettings
from gpuhealth.controller.shards.peers import ShardAnswer
from gpuhealth.protocol.shards import shard_of
from tests.support.clock import FakeClock
from tests.support.protocol import allocation, gpu_uuid, hello, snapshot
from tests.unit.controller.incidents.test_forwarder import LIMITS as FORWARDER_LIMITS
from tests.unit.controller.incidents.test_judge import Events, Jobs, xid

COUNT = 2
SETTINGS = JudgeSettings()
HORIZON_S = max(SETTINGS.job_window_s, SETTINGS.gpu_window_s)
LIMITS = replace(FORWARDER_LIMITS, horizon_s=HORIZON_S)


def nodes_of(shard: int, k: int) -> list[str]:
    out: list[str] = []
    i = 0
    while len(out) < k:
        if shard_of(f"n{i}", COUNT) == shard:
            out.append(f"n{i}")
        i += 1
    return out


class Network:
    """Delivers a POST to the owner of the shard, as the route would (decoded, converted)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.judges: dict[int, IncidentJudge] = {}

    async def post(self, shard: int, path: str, body: bytes) -> ShardAnswer:
        judge = self.judges[shard]
        if path == ATTEMPTS_PATH:
            for s in msgspec.json.decode(body, type=AttemptBatch).sets:
                judge.receive_attempts(
                    s.job,
                    s.shard,
                    [received_attempt(s.job, a, self.clock, HORIZON_S) for a in s.attempts],
                )
        else:
            batch = msgspec.json.decode(body, type=XidBatch)
            judge.receive_reports([received_xid(h, self.clock, HORIZON_S) for h in batch.reports])
        return ShardAnswer((shard,), {})


def replica(shard: int, clock: FakeClock, net: Network) -> tuple[IncidentJudge, HandoffForwarder]:
    judge = IncidentJudge(
        SETTINGS,
        IncidentBook(),
        Fleet(clock=clock),
        clock=clock,
        jobs=Jobs(),
        events=Events(),
        may_write=lambda: True,
    )

    async def node_shard(node: str) -> int | None:
        return shard_of(node, COUNT)

    judge.home = JobHome(COUNT, lambda: frozenset({shard}), lambda n: shard_of(n, COUNT) == shard)
    judge.forwarder = HandoffForwarder(
        net, LIMITS, clock=clock, metrics=HandoffMetrics(CollectorRegistry()), node_shard=node_shard
    )
    net.judges[shard] = judge
    return judge, judge.forwarder


@pytest.mark.parametrize("first_on_home", [False, True])
async def test_a_job_across_two_shards_is_decided_by_its_home_alone(first_on_home: bool) -> None:
    clock = FakeClock()
    net = Network(clock)
    replicas = {i: replica(i, clock, net) for i in range(COUNT)}
    job = "ns/Job/train"  # Jobs(): pod ``train-<n>`` is Job ``train``
    home = home_shard(job, COUNT)
    nodes = {i: nodes_of(i, 2) for i in range(COUNT)}
    first = nodes[home if first_on_home else 1 - home][0]
    for shard, names in nodes.items():
        judge, _ = replicas[shard]
        for k, n in enumerate(names):
            judge.on_connect(n, hello(n, 1))
            pod = f"train-{shard}{k}"
            judge.on_message(n, snapshot(n, 1, allocations=[allocation(gpu_uuid(0, n), pod)]))
    every = sorted(n for names in nodes.values() for n in names)

    async def exchange() -> None:
        for _ in range(2):  # reports go home, the home decides, its attempts go back
            for judge, fwd in replicas.values():
                await judge.step()
                assert await fwd.flush()

    for _ in range(SETTINGS.blame_attempts):
        replicas[shard_of(first, COUNT)][0].on_message(first, xid(clock, first, 0, 31))
        clock.advance(0.5)
        for shard, names in nodes.items():
            for n in names:
                replicas[shard][0].on_message(n, xid(clock, n, 0, 43))
        await exchange()
        [incident] = replicas[home][0].book.list(kind="job")
        assert incident.key == job and list(incident.subjects.nodes) == every
        assert replicas[1 - home][0].book.list(kind="job") == []
        clock.advance(SETTINGS.attempt_gap_s + 30)

    await exchange()
    owner = replicas[shard_of(first, COUNT)][0]
    other = replicas[1 - shard_of(first, COUNT)][0]
    assert list(owner.blamed()) == [(first, gpu_uuid(0, first))]
    assert other.blamed() == {}
    [gpu] = owner.book.list(kind="gpu")
    assert f"the first to fault in {SETTINGS.blame_attempts} attempts of {job}" in gpu.reason


async def test_a_home_shard_lost_hands_the_job_incident_over_unwritten() -> None:
    """The replica that decided a job loses its home shard: the job's incident leaves its
    book without a close (the new home's object is not closed under it)."""
    clock = FakeClock()
    net = Network(clock)
    judge, _ = replica(home_shard("ns/Job/train", COUNT), clock, net)
    owned = {home_shard("ns/Job/train", COUNT)}
    judge.home = JobHome(COUNT, lambda: frozenset(owned), lambda _n: True)
    changes: list[str] = []
    judge.book.subscribe(lambda change, _i: changes.append(change))
    for k, n in enumerate(["n-a", "n-b"]):
        judge.on_connect(n, hello(n, 1))
        judge.on_message(n, snapshot(n, 1, allocations=[allocation(gpu_uuid(0, n), f"train-{k}")]))
    await judge.step()
    for n in ("n-a", "n-b"):
        judge.on_message(n, xid(clock, n, 0, 43))
    await judge.step()
    assert [i.key for i in judge.book.list(kind="job")] == ["ns/Job/train"]
    owned.clear()  # the home shard went to another replica
    changes.clear()
    await judge.step()
    assert judge.book.list(kind="job") == [] and "closed" not in changes


async def test_a_judge_turned_off_takes_nothing_from_other_owners() -> None:
    clock = FakeClock()
    judge = IncidentJudge(
        JudgeSettings(enabled=False),
        IncidentBook(),
        Fleet(clock=clock),
        clock=clock,
        jobs=Jobs(),
    )
    job = "ns/Job/train"
    reports = [
        XidOccurrence(clock.monotonic(), n, gpu_uuid(0, n), 43, "app-abort", job, f"ns/train-{n}")
        for n in ("n-a", "n-b")
    ]
    at = clock.monotonic()
    judge.receive_reports(reports)
    judge.receive_attempts(job, 0, [JobAttempt(job, at, at, "n-a", gpu_uuid(0, "n-a"), 31)])
    await judge.step()
    assert judge.book.list() == [] and judge.blamed() == {}
