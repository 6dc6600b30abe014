"""The ``gpuhealth-controller`` process end to end, and the node watch's 410 Gone handling."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from gpuhealth.controller.kube.node_cache import NodeCache
from gpuhealth.controller.kube.rest import request
from gpuhealth.protocol import Ack, encode
from gpuhealth.protocol.codec import decode_controller
from localkube import ControlPlane, ControlPlaneSettings
from tests.integration.controller_helpers import (
    Cluster,
    cluster,
    controller_process,
    get_node,
    our_taints,
)
from tests.integration.tooling import require
from tests.support.protocol import fault, hello, snapshot
from tests.support.wait import until

pytestmark = pytest.mark.integration


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[Cluster]:
    async with cluster(control_plane) as c:
        yield c


async def test_watch_answered_410_gone_relists(kube_assets: Path) -> None:
    """A watch from a compacted resourceVersion gets 410 Gone; the cache relists and goes on.

    Its own control plane without the apiserver's watch cache, so that watches reach etcd,
    and an etcd compaction makes the old revision unavailable."""
    settings = ControlPlaneSettings(extra_apiserver_args=("--watch-cache=false",))
    async with ControlPlane(kube_assets, settings) as cp, cluster(cp) as kube:
        name = await kube.node("gpu-gone")
        old = (await request(kube.api, "GET", f"/api/v1/nodes/{name}"))["metadata"]
        for i in range(3):
            await _label(kube, name, str(i))
        rev = int(
            (await request(kube.api, "GET", f"/api/v1/nodes/{name}"))["metadata"]["resourceVersion"]
        )
        async with aiohttp.ClientSession() as s:
            payload = {"revision": str(rev), "physical": True}
            async with s.post(f"{cp.etcd_url}/v3/kv/compaction", json=payload) as resp:
                assert resp.status == 200, await resp.text()
        cache = NodeCache(kube.api)
        cache.resume_from(old["resourceVersion"])
        task = asyncio.create_task(cache.run())
        try:
            await asyncio.wait_for(cache.synced.wait(), 15)
            assert cache.relists == 1
            view = cache.get(name)
            assert view is not None and view.labels.get("x") == "2"
            await _label(kube, name, "after")

            async def labelled() -> bool | None:
                v = cache.get(name)
                return True if v and v.labels.get("x") == "after" else None

            await until(labelled, "the watch to deliver the change after the relist")
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _label(kube: Cluster, name: str, value: str) -> None:
    await request(
        kube.api,
        "PATCH",
        f"/api/v1/nodes/{name}",
        body={"metadata": {"labels": {"x": value}}},
        content_type="application/merge-patch+json",
    )


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with session.get(url) as resp:
        return resp.status, await resp.text()


async def test_controller_process_serves_and_stops_cleanly(
    kube: Cluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    node = await kube.node(unique_name("gpu"))
    release = await kube.release()
    cfg = {
        "leader": {
            "identity": "proc-1",
            "lease_duration_s": 4,
            "renew_deadline_s": 3.0,
            "retry_period_s": 1.0,
        },
    }
    async with controller_process(kube, tmp_path, cfg) as (proc, base):
        async with aiohttp.ClientSession() as s:

            async def ready() -> bool | None:
                status, _ = await _get(s, f"{base}/readyz")
                return True if status == 200 else None

            await until(ready, "/readyz 200 (leader)", timeout_s=30)
            status, _ = await _get(s, f"{base}/healthz")
            assert status == 200
            status, text = await _get(s, f"{base}/metrics")
            assert status == 200
            assert "gpuhealth_controller_is_leader 1.0" in text
            assert "gpuhealth_circuit_breaker_open 0.0" in text
            promtool = require("promtool", hint="hack/system-deps.sh installs Debian's prometheus")
            out = subprocess.run(
                [promtool, "check", "metrics"],
                input=text,
                capture_output=True,
                text=True,
                check=False,
            )
            assert out.returncode == 0, out.stdout + out.stderr
            async with s.get(f"{base}/api/v1/fleet") as resp:
                fleet: dict[str, Any] = await resp.json()
            assert fleet["leader"] is True
            assert node in {n["name"] for n in fleet["nodes"]}
            async with s.post(f"{base}/api/v1/breaker/reset") as resp:
                assert resp.status == 401  # operators only (test_operator_auth.py)
            async with s.get(f"{base}/v1/stream") as resp:
                assert resp.status in (400, 401, 403, 426)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 20) == 0
    lease = release.config["leader"]["lease_name"]
    got = await request(
        kube.api,
        "GET",
        f"/apis/coordination.k8s.io/v1/namespaces/{release.namespace}/leases/{lease}",
    )
    assert not got["spec"].get("holderIdentity")


async def test_agent_stream_to_taint_end_to_end(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    """Bytes on the controller's /v1/stream (bound-token auth, the real app) -> a taint."""
    node = await kube.node(unique_name("gpu"))
    _, token = await kube.agent(node)  # the chart's agent ServiceAccount and namespace
    ctl = await kube.controller()
    server = TestServer(ctl.web_app(), host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(
                f"ws://127.0.0.1:{server.port}/v1/stream",
                headers={"Authorization": f"Bearer {token}"},
            )
            h = hello(node)
            snap = snapshot(node)
            ev = fault(node, 1)
            for msg in (h, snap, ev):
                await ws.send_bytes(encode(msg))

            async def acked() -> bool | None:
                reply = decode_controller((await ws.receive(timeout=10)).data)
                return True if isinstance(reply, Ack) and reply.seq >= ev.seq else None

            await until(acked, "the Ack of the fault event")

            async def tainted() -> list[tuple[str, str, str]] | None:
                return our_taints(await get_node(kube.api, node)) or None

            assert await until(tainted, "the taint") == [
                ("gpuhealth.io/unhealthy", "xid-79", "NoSchedule")
            ]
            await ws.close()
    finally:
        await server.close()


async def test_agent_missing_a_gpu_taints_its_node_gpu_missing(
    kube: Cluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    """A real agent on the NVML source (fake driver: 1 of the 2 expected GPUs answers)
    streams to the controller's /v1/stream; the node is tainted ``gpu-missing``. After the
    "power cycle" (a new agent, both GPUs visible) the taint goes."""
    from gpuhealth.agent.settings import load_config
    from gpuhealth.agent.sources.nvml.settings import NvmlSettings
    from gpuhealth.agent.sources.nvml.source import NvmlSource
    from gpuhealth.agent.wiring import build_agent
    from gpuhealth.common.clock import SystemClock
    from tests.fakes.fake_pynvml import h100_node

    node = await kube.node(unique_name("gpu"))
    _, token = await kube.agent(node)
    token_file = tmp_path / "token"
    token_file.write_text(token)
    ctl = await kube.controller()
    server = TestServer(ctl.web_app(), host="127.0.0.1")
    await server.start_server()

    async def agent_with(visible: int) -> Any:
        fake = h100_node(2)
        fake.visible = visible
        settings = NvmlSettings(expected_gpus=2, poll_interval_s=0.05)
        cfg = load_config(
            None,
            {
                "node_name": node,
                "controller_url": f"ws://127.0.0.1:{server.port}/v1/stream",
                "token_file": str(token_file),
                "listen": "127.0.0.1:0",
                "state_dir": str(tmp_path / f"state-{visible}"),
                "kmsg_path": "none",
                "podresources": {"enabled": False},
            },
        )
        app = build_agent(cfg, sources=[NvmlSource(settings, SystemClock(), fake)], boot_id="b")
        await app.start()
        return app

    async def taints() -> list[tuple[str, str, str]]:
        return our_taints(await get_node(kube.api, node))

    try:
        app = await agent_with(1)
        try:

            async def tainted() -> list[tuple[str, str, str]] | None:
                return await taints() or None

            assert await until(tainted, "the gpu-missing taint") == [
                ("gpuhealth.io/unhealthy", "gpu-missing", "NoSchedule")
            ]

            async def condition() -> dict[str, Any] | None:
                n = await get_node(kube.api, node)
                conds = n["status"].get("conditions") or []
                return next((c for c in conds if c["type"] == "GPUHealthy"), None)

            cond = await until(condition, "the GPUHealthy condition")
            assert cond["status"] == "False" and cond["reason"] == "GpuMissing"
            assert "1 of 2 expected GPUs visible" in cond["message"]
        finally:
            await app.stop()
        app = await agent_with(2)
        try:

            async def untainted() -> bool:
                return await taints() == []

            await until(untainted, "the taint removed once every GPU is visible")
        finally:
            await app.stop()
    finally:
        await server.close()
