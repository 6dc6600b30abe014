"""The receiving side of the job handoffs (``controller/incidents/handoff.py``): the two routes
behind the real HTTP authorizer (a recorded access reviewer), what reaches the judge, and
garbage refused with a 400 and a count."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import msgspec
import pytest
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from gpuhealth.controller.http.access import Access, ResourceAccess
from gpuhealth.controller.http.access_review import AccessVerdict
from gpuhealth.controller.http.auth import HttpAuthMetrics, HttpAuthorizer
from gpuhealth.controller.http.settings import HttpAuthSettings
from gpuhealth.controller.incidents.blame import JobAttempt, XidOccurrence
from gpuhealth.controller.incidents.handoff import (
    ATTEMPTS_PATH,
    REPORTS_PATH,
    AttemptBatch,
    AttemptSet,
    HandoffMetrics,
    HandoffRoutes,
    XidBatch,
    handed_attempt,
    handed_xid,
)
from gpuhealth.controller.stream.auth import Identity, StaticAuthenticator
from tests.support.clock import FakeClock

REPLICA = Identity(authenticated=True, username="system:serviceaccount:gpu:ctl", uid="u1")
VIEWER = Identity(authenticated=True, username="viewer", uid="u2")
TOKENS = {"replica": REPLICA, "viewer": VIEWER}
HORIZON_S = 3600.0


@dataclass
class Reviewer:
    """Grants ``create shardreports`` to the replicas' ServiceAccount only."""

    calls: list[Access] = field(default_factory=list)

    async def review(self, identity: Identity, access: Access) -> AccessVerdict:
        self.calls.append(access)
        granted = ResourceAccess("create", "shardreports", "gpu")
        return AccessVerdict(identity is REPLICA and access == granted)


@dataclass
class Judge:
    reports: list[XidOccurrence] = field(default_factory=list)
    attempts: dict[tuple[str, int], list[JobAttempt]] = field(default_factory=dict)

    def receive_reports(self, reports: Sequence[XidOccurrence]) -> None:
        self.reports.extend(reports)

    def receive_attempts(self, job: str, shard: int, attempts: Sequence[JobAttempt]) -> None:
        self.attempts[(job, shard)] = list(attempts)


@dataclass
class Receiver:
    client: TestClient[Any, Any]
    judge: Judge
    routes: HandoffRoutes
    clock: FakeClock

    async def post(self, path: str, body: bytes, token: str = "replica") -> ClientResponse:
        return await self.client.post(path, data=body, headers={"Authorization": f"Bearer {token}"})


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    clock = FakeClock()
    judge = Judge()
    routes = HandoffRoutes(judge, clock, HandoffMetrics(CollectorRegistry()), horizon_s=HORIZON_S)
    auth = HttpAuthorizer(
        HttpAuthSettings(cache_ttl_s=0.0),
        StaticAuthenticator(TOKENS),
        Reviewer(),
        namespace="gpu",
        clock=clock,
        metrics=HttpAuthMetrics(None),
    )
    app = web.Application(middlewares=[auth.middleware])
    app.add_routes(routes.routes())
    async with TestClient(TestServer(app)) as client:
        yield Receiver(client, judge, routes, clock)


SENDER = FakeClock(monotonic_start=50_000.0)
"""Another replica's clock: the same wall time, another monotonic time."""


def report(ago: float, node: str = "node-a") -> XidOccurrence:
    return XidOccurrence(
        at=SENDER.monotonic() - ago,
        node=node,
        gpu="GPU-1",
        xid=31,
        xid_class="app-fault",
        job="ml/JobSet/train",
        pod="ml/train-0",
        detail="MMU Fault",
    )


async def test_reports_reach_the_judge_on_its_own_monotonic_clock(receiver: Receiver) -> None:
    body = msgspec.json.encode(
        XidBatch([handed_xid(r, "ml/JobSet/train", SENDER) for r in (report(30.0), report(9e9))])
    )
    resp = await receiver.post(REPORTS_PATH, body)
    assert resp.status == 200 and (await resp.json()) == {"accepted": 2}
    recent, ancient = receiver.judge.reports
    now = receiver.clock.monotonic()
    assert recent.at == pytest.approx(now - 30.0)
    assert ancient.at == pytest.approx(now - HORIZON_S)  # clamped to the horizon
    assert (recent.node, recent.job, recent.xid, recent.detail) == (
        "node-a",
        "ml/JobSet/train",
        31,
        "MMU Fault",
    )


async def test_an_attempt_set_replaces_the_last_one_for_its_job_and_shard(
    receiver: Receiver,
) -> None:
    at = SENDER.monotonic() - 900
    attempt = JobAttempt("ml/JobSet/train", at, at + 3, "node-a", "GPU-1", 31, "GPC 4, TPC 1, SM 0")
    body = msgspec.json.encode(
        AttemptBatch([AttemptSet("ml/JobSet/train", 2, [handed_attempt(attempt, SENDER)])])
    )
    assert (await receiver.post(ATTEMPTS_PATH, body)).status == 200
    [got] = receiver.judge.attempts[("ml/JobSet/train", 2)]
    assert got.first_at == pytest.approx(receiver.clock.monotonic() - 900)
    assert got.last_at - got.first_at == pytest.approx(3.0)
    assert (got.node, got.gpu, got.xid, got.where) == ("node-a", "GPU-1", 31, "GPC 4, TPC 1, SM 0")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (REPORTS_PATH, b"not json"),
        (REPORTS_PATH, b"[]"),
        (REPORTS_PATH, b'{"reports": [{"node": "n"}]}'),
        (REPORTS_PATH, b'{"reports": [], "extra": 1}'),
        (
            REPORTS_PATH,  # a time without its zone: whose clock?
            b'{"reports": [{"at": "2026-01-01T00:00:00", "node": "n", "gpu": "g", "xid": 1,'
            b' "xid_class": "c", "job": "j"}]}',
        ),
        (ATTEMPTS_PATH, b'{"sets": [{"job": "j", "shard": 99, "attempts": []}]}'),
        (ATTEMPTS_PATH, b'{"sets": [{"job": "", "shard": 0, "attempts": []}]}'),
    ],
)
async def test_garbage_is_a_400_counted_and_changes_nothing(
    receiver: Receiver, path: str, body: bytes
) -> None:
    resp = await receiver.post(path, body)
    assert resp.status == 400 and (await resp.json())["error"] == "malformed"
    kind = "reports" if path == REPORTS_PATH else "attempts"
    assert receiver.routes.metrics.rejected.labels(kind)._value.get() == 1
    assert receiver.judge.reports == [] and receiver.judge.attempts == {}


async def test_a_caller_without_the_verb_is_refused(receiver: Receiver) -> None:
    body = msgspec.json.encode(XidBatch([]))
    assert (await receiver.post(REPORTS_PATH, body, token="viewer")).status == 403
    assert (await receiver.post(ATTEMPTS_PATH, body, token="nobody")).status == 401
    assert receiver.judge.reports == []


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(raw=st.one_of(st.binary(max_size=300), st.text(max_size=300).map(str.encode)))
async def test_any_body_is_answered_never_a_crash(receiver: Receiver, raw: bytes) -> None:
    for path in (REPORTS_PATH, ATTEMPTS_PATH):
        resp = await receiver.post(path, raw)
        assert resp.status in (200, 400)


def test_wall_time_round_trips_between_two_monotonic_clocks() -> None:
    here = FakeClock(monotonic_start=7.0)
    r = report(120.0)
    h = handed_xid(r, "ml/JobSet/train", SENDER)
    assert h.at == SENDER.now() - timedelta(seconds=120)
    assert h.at == here.now() - timedelta(seconds=120)
