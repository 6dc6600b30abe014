"""LeaderWork: its prepare before any task (the node cache, the breaker, the incidents
adopted), ``ready`` only in between, and ``/readyz`` false until then."""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from gpuhealth.controller.http.routes import Probes
from gpuhealth.controller.leadership.work import LeaderWork, NamedTask


class Tasks:
    def healthy(self) -> bool:
        return True

    def status(self) -> dict[str, dict[str, object]]:
        return {}


async def test_the_work_is_ready_only_between_its_prepare_and_its_end() -> None:
    adopted = asyncio.Event()
    started: list[str] = []

    async def prepare() -> None:
        await adopted.wait()  # e.g. the GPUIncidents' LIST, retried while refused

    async def reconciler() -> None:
        started.append("reconciler")
        await asyncio.Event().wait()

    work = LeaderWork(prepare=prepare, tasks=(NamedTask("reconciler", reconciler),))
    probes = Probes(
        registry=CollectorRegistry(),
        tasks=Tasks(),
        is_leader=lambda: True,
        leader_ready=lambda: work.ready,
        synced=lambda: True,
    )
    app = web.Application()
    app.add_routes(probes.routes())
    async with TestClient(TestServer(app)) as client:
        term = asyncio.create_task(work.run())
        await asyncio.sleep(0.01)
        assert not work.ready and started == []
        resp = await client.get("/readyz")
        assert resp.status == 503 and (await resp.json())["leader_ready"] is False
        adopted.set()
        await asyncio.sleep(0.01)
        assert work.ready and started == ["reconciler"]
        assert (await client.get("/readyz")).status == 200
        term.cancel()  # the lead is lost
        await asyncio.gather(term, return_exceptions=True)
        assert not work.ready
        assert (await client.get("/readyz")).status == 503
