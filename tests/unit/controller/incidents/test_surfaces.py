"""Incidents where people look: /api/v1/fleet and /api/v1/incidents, the status page's overview
and activity, ``gpuhealth-controller status``."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gpuhealth.controller.breaker.gate import CircuitBreaker
from gpuhealth.controller.breaker.settings import BreakerSettings
from gpuhealth.controller.fleet.cache import FleetCache
from gpuhealth.controller.fleet.model import Fleet
from gpuhealth.controller.http.api import ApiV1, node_fragment
from gpuhealth.controller.incidents.model import IncidentBook, Subjects
from gpuhealth.controller.names import Keys
from gpuhealth.controller.status_cli import render_table
from gpuhealth.controller.status_page import StatusPage
from tests.support.clock import FakeClock
from tests.support.fleet import connect
from tests.support.nodes import FakeNodeCache

K = Keys("gpuhealth.io")


def book_with_three(clock: FakeClock) -> IncidentBook:
    book = IncidentBook()
    book.open(
        "job",
        "ml/Job/train/app-fault",
        subjects=Subjects(nodes=tuple(f"n{i}" for i in range(16)), owner="ml/Job/train"),
        decision="no taint",
        reason="XID 13 (app-fault) on 16 GPU(s) of 16 nodes, all running ml/Job/train",
        now=clock.now(),
        evidence={"nodes": 16},
        xid_class="app-fault",
    )
    book.open(
        "gpu",
        "bad/GPU-1",
        subjects=Subjects(nodes=("bad",), gpus=("bad/GPU-1",)),
        decision="gpu blamed: unhealthy + diagnostic",
        reason="XID 31 on GPU GPU-1 of bad under 3 different jobs",
        now=clock.now(),
    )
    book.open(
        "unwatched",
        "lonely",
        subjects=Subjects(nodes=("lonely",)),
        decision="condition AgentMissing",
        reason="GPU node with no gpuhealth agent",
        now=clock.now(),
    )
    return book


async def test_api_lists_open_incidents_with_decision_and_reason() -> None:
    clock = FakeClock()
    fleet = Fleet(clock=clock)
    connect(fleet, "n0", 1)
    book = book_with_three(clock)
    breaker = CircuitBreaker(BreakerSettings(), clock)
    api = ApiV1(
        cache=FleetCache(fleet, FakeNodeCache(), K, node_fragment),
        breaker_status=breaker.status,
        reset_breaker_and_requeue=list,
        is_leader=lambda: True,
        dry_run=False,
        clock=clock,
        incidents=book,
    )
    doc = api.fleet_document()
    assert sorted(i["kind"] for i in doc["incidents"]) == ["gpu", "job", "unwatched"]
    job = next(i for i in doc["incidents"] if i["kind"] == "job")
    assert job["decision"] == "no taint" and job["subjects"]["owner"] == "ml/Job/train"
    book.close(book.list(kind="unwatched")[0].id, clock.now())
    app = web.Application()
    app.add_routes(api.routes())
    async with TestClient(TestServer(app)) as client:
        body = await (await client.get("/api/v1/incidents")).json()
        assert body["open"] == {
            "job": 1,
            "gpu": 1,
            "domain": 0,
            "unwatched": 0,
            "override": 0,
            "capability": 0,
        }
        assert [i["state"] for i in body["incidents"]] == ["open", "open", "closed"]
        only_open = await (await client.get("/api/v1/incidents?state=open")).json()
        assert len(only_open["incidents"]) == 2
        assert (await client.get("/api/v1/incidents?state=x")).status == 400
        fleet_doc = await (await client.get("/api/v1/fleet")).json()
        assert len(fleet_doc["incidents"]) == 2


def test_status_page_lists_incidents_and_logs_them() -> None:
    clock = FakeClock()
    fleet = Fleet(clock=clock)
    book = IncidentBook()
    page = StatusPage(fleet=fleet, keys=K, clock=clock, incidents=book, incident_book=book)
    for kind, iid in [("job", "a"), ("gpu", "b")]:
        book.open(
            kind,  # type: ignore[arg-type]
            iid,
            subjects=Subjects(nodes=("n1",)),
            decision="d",
            reason="r",
            now=clock.now(),
        )
    doc: Any = page.overview()
    assert sorted(i["kind"] for i in doc["incidents"]) == ["gpu", "job"]
    assert any("job incident opened" in str(e) for e in doc["events"])


def test_cli_prints_incidents_with_what_was_decided_and_why() -> None:
    clock = FakeClock()
    book = book_with_three(clock)
    fleet = {
        "nodes": [
            {
                "name": "lonely",
                "state": "unknown",
                "gpus": [],
                "taints": [],
                "connected": False,
                "condition": {"status": "Unknown", "reason": "AgentMissing"},
            }
        ],
        "incidents": [i.to_dict() for i in book.list()],
    }
    text = render_table(fleet)
    assert "lonely  unknown (no agent)" in text
    assert "incidents: 1 gpu, 1 job, 1 unwatched" in text
    assert "ml/Job/train (16 nodes)" in text and "no taint" in text
    assert "gpu blamed: unhealthy + diagnostic" in text and "bad/GPU-1" in text


async def test_the_api_says_who_took_an_incident_and_whether_it_pages() -> None:
    from datetime import timedelta

    from gpuhealth.controller.incidents.lifecycle import Lifecycle, OnCallAction, observe

    clock = FakeClock()
    book = book_with_three(clock)
    now = clock.now()
    gpu = book.list(kind="gpu")[0]
    taken = Lifecycle(
        acknowledged=OnCallAction("alice", now, "on it"),
        silenced=OnCallAction("bob", now, "swap", until=now + timedelta(hours=1)),
    )
    observed, _ = observe(taken, gpu.observed, now)
    book.set_lifecycle(gpu.id, taken, observed)
    api = ApiV1(
        cache=FleetCache(Fleet(clock=clock), FakeNodeCache(), K, node_fragment),
        breaker_status=CircuitBreaker(BreakerSettings(), clock).status,
        reset_breaker_and_requeue=list,
        is_leader=lambda: True,
        dry_run=False,
        clock=clock,
        incidents=book,
    )
    docs = {i["kind"]: i for i in api.incidents_document()}
    assert docs["job"]["paging"] == "paging" and "lifecycle" not in docs["job"]
    assert docs["gpu"]["paging"] == "silenced"
    assert docs["gpu"]["lifecycle"]["acknowledged"] == {
        "by": "alice",
        "at": docs["gpu"]["openedAt"],
        "reason": "on it",
        "applied": True,
    }
    assert docs["gpu"]["lifecycle"]["silenced"]["until"].endswith("Z")
    clock.advance(7200)
    assert {i["kind"]: i for i in api.incidents_document()}["gpu"]["paging"] == "acknowledged"
