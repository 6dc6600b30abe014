"""The supervisor: restarts with the one backoff through any number of crashes, starts the
count again after a stable run, and a task that ended makes it (and both /healthz) unhealthy."""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from gpuhealth.agent.app import core_tasks_running
from gpuhealth.agent.node_snapshot import NodeSnapshotCache
from gpuhealth.agent.server import build_app
from gpuhealth.common.tasks import RestartPolicy, Supervisor
from gpuhealth.controller.http.routes import Probes
from tests.support.agent import engine_with
from tests.support.clock import FakeClock, settle

POLICY = RestartPolicy(initial_s=0.5, max_s=30.0, factor=2.0, jitter=0.0, stable_after_s=60.0)


def test_any_restart_attempt_has_a_capped_delay() -> None:
    policy = RestartPolicy(jitter=0.0)
    assert policy.delay(1) == 0.5
    assert policy.delay(1026) == policy.max_s  # 2.0 ** 1025 raised OverflowError
    assert policy.delay(10**12) == policy.max_s


async def test_the_supervisor_outlives_thousands_of_crashes() -> None:
    clock = FakeClock()
    crashes = 0

    async def crash() -> None:
        nonlocal crashes
        crashes += 1
        raise RuntimeError(f"crash {crashes}")

    sup = Supervisor(clock=clock, policy=POLICY, rand=lambda: 0.5)
    sup.start("crashy", crash)
    try:
        await settle()
        for n in range(1, 3001):
            assert crashes == n
            assert not sup.healthy()  # waiting to restart
            clock.advance(POLICY.max_s)
            await settle()
        st = sup.status()["crashy"]
        assert st["failures"] == 3001 and st["last_error"] == "RuntimeError: crash 3001"
        assert not st["ended"]
        assert clock.pending_sleepers == 1  # still supervising, waiting its capped delay
    finally:
        await sup.stop()


async def test_the_delay_grows_then_starts_again_after_a_stable_run() -> None:
    clock = FakeClock()
    runs: list[float] = []
    stable = asyncio.Event()

    async def task() -> None:
        runs.append(clock.monotonic())
        if stable.is_set():
            stable.clear()
            await clock.sleep(POLICY.stable_after_s)
        raise RuntimeError("boom")

    sup = Supervisor(clock=clock, policy=POLICY, rand=lambda: 0.5)
    sup.start("t", task)
    try:
        await settle()
        for _ in range(4):  # delays 0.5, 1, 2, 4
            clock.advance(POLICY.max_s)
            await settle()
        assert len(runs) == 5
        # the fifth crash waits 8 s: not restarted after 7.9
        clock.advance(7.9)
        await settle()
        assert len(runs) == 5
        clock.advance(0.1)
        await settle()
        assert len(runs) == 6
        # the next run lasts the stable period, then crashes: back to the first delay
        stable.set()
        clock.advance(16.0)
        await settle()
        assert len(runs) == 7
        clock.advance(POLICY.stable_after_s)
        await settle()
        clock.advance(0.5)
        await settle()
        assert len(runs) == 8
    finally:
        await sup.stop()


async def test_a_task_that_returned_is_not_healthy() -> None:
    clock = FakeClock()
    done = asyncio.Event()

    async def short() -> None:
        await done.wait()

    async def forever() -> None:
        await asyncio.Event().wait()

    sup = Supervisor(clock=clock, policy=POLICY)
    sup.start("forever", forever)
    sup.start("short", short)
    try:
        await settle()
        assert sup.healthy()
        done.set()
        await settle()
        assert not sup.healthy()
        assert sup.status()["short"]["ended"] and not sup.status()["short"]["running"]
        assert not sup.status()["forever"]["ended"]
    finally:
        await sup.stop()


async def test_a_task_that_crashed_without_restart_is_not_healthy() -> None:
    async def crash() -> None:
        raise RuntimeError("once")

    failures: list[str] = []
    sup = Supervisor(clock=FakeClock(), policy=POLICY, on_failure=lambda n, _e: failures.append(n))
    sup.start("once", crash, restart=False)
    try:
        await settle()
        assert failures == ["once"]
        assert not sup.healthy() and sup.status()["once"]["ended"]
    finally:
        await sup.stop()


async def test_the_controller_healthz_is_red_when_a_task_ended() -> None:
    done = asyncio.Event()

    async def task() -> None:
        await done.wait()

    sup = Supervisor(clock=FakeClock(), policy=POLICY)
    probes = Probes(
        registry=CollectorRegistry(),
        tasks=sup,
        is_leader=lambda: True,
        leader_ready=lambda: True,
        synced=lambda: True,
    )
    app = web.Application()
    app.add_routes(probes.routes())
    sup.start("node-watch", task)
    try:
        async with TestClient(TestServer(app)) as c:
            await settle()
            assert (await c.get("/healthz")).status == 200
            assert (await c.get("/readyz/replica")).status == 200
            done.set()
            await settle()
            resp = await c.get("/healthz")
            assert resp.status == 503
            body = await resp.json()
            assert body["ok"] is False and body["tasks"]["node-watch"]["ended"] is True
            assert (await c.get("/readyz/replica")).status == 503
    finally:
        await sup.stop()


async def test_the_agent_healthz_is_red_when_a_core_task_ended() -> None:
    done = asyncio.Event()

    async def tick() -> None:
        await done.wait()

    async def serve() -> None:
        await asyncio.Event().wait()

    clock = FakeClock()
    state = NodeSnapshotCache("n", engine_with(1), clock)  # type: ignore[arg-type]
    sup = Supervisor(clock=clock, policy=POLICY)
    app = build_app(state, CollectorRegistry(), lambda: core_tasks_running(sup.status()))
    sup.start("engine-tick", tick)
    sup.start("http", serve)
    try:
        async with TestClient(TestServer(app)) as c:
            await settle()
            assert (await c.get("/healthz")).status == 200
            done.set()
            await settle()
            assert (await c.get("/healthz")).status == 503
    finally:
        await sup.stop()
