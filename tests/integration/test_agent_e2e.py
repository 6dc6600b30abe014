"""The agent end to end, in-process: simulator + a kernel-log file -> /api/v1/status, /metrics.

Real HTTP on 127.0.0.1, real time (short poll intervals), no Kubernetes needed.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc.aio
import pytest

from gpuhealth.agent.app import AgentApp
from gpuhealth.agent.counters import Counters, Histogram
from gpuhealth.agent.observations import ObservationSink, SourceName
from gpuhealth.agent.podresources._pb import api_pb2, api_pb2_grpc
from gpuhealth.agent.settings import load_config
from gpuhealth.agent.wiring import build_agent
from gpuhealth.common.tasks import RestartPolicy
from gpuhealth.protocol import Snapshot
from gpuhealth.protocol.codec import decode_agent
from tests.support.wait import until

pytestmark = pytest.mark.integration

SCENARIO = "name: e2e\ngpus: 2\npoll_interval_s: 0.05\n"
# GPU 1 of the simulator sits at PCI 0000:29:00.0 (0x18 + 0x11 * index).
XID_LINE = (
    "[ 8123.456789] NVRM: Xid (PCI:0000:29:00): 79, pid='<unknown>', name=<unknown>, "
    "GPU has fallen off the bus.\n"
)


def _config(tmp_path: Path, **extra: Any) -> Any:
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(SCENARIO)
    kmsg = tmp_path / "kmsg"
    # already there at start: the follower starts at the end and must not count it
    kmsg.write_text("[    0.000000] Linux version 6.8.0 (buildd@lcy02)\n")
    return load_config(
        None,
        {
            "node_name": "gpu-node-7",
            "source": "sim",
            "sim_scenario": str(scenario),
            "kmsg_path": str(kmsg),
            "listen": "127.0.0.1:0",
            "state_dir": str(tmp_path / "state"),
            "tick_interval_s": 0.05,
            "podresources": {"socket": str(tmp_path / "no-kubelet.sock")},
            **extra,
        },
    )


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def _started(app: AgentApp) -> str:
    await app.start()
    await asyncio.wait_for(app.http_started.wait(), 10)
    return f"http://127.0.0.1:{app.http.port}"


async def test_kmsg_xid_makes_gpu_unhealthy(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    cfg = _config(tmp_path)
    app = build_agent(cfg, boot_id="boot-e2e")
    try:
        base = await _started(app)

        async def ready() -> bool:
            async with http.get(f"{base}/readyz") as r:
                return r.status == 200

        await until(ready)

        async def attached() -> bool:
            return app.source_ready("kmsg")

        await until(attached)  # the follower starts at the end: lines before it are history
        async with http.get(f"{base}/api/v1/status") as r:
            before = await r.json()
        assert [g["state"] for g in before["gpus"]] == ["healthy", "healthy"]

        with open(cfg.kmsg_path, "a") as f:
            f.write(XID_LINE)

        async def unhealthy() -> dict[str, Any] | None:
            async with http.get(f"{base}/api/v1/status") as r:
                body = await r.json()
            gpu = body["gpus"][1]
            return gpu if gpu["state"] == "unhealthy" else None

        gpu = await until(unhealthy)
        assert gpu["pci_bus_id"] == "00000000:29:00.0"
        xid = [c for c in gpu["conditions"] if c["reason"] == "XidError"]
        assert xid and xid[0]["xid"] == 79 and xid[0]["action"] == "RESTART_BM"

        async def metrics_show_it() -> str | None:
            async with http.get(f"{base}/metrics") as r:
                text = await r.text()
            return text if "gpuhealth_agent_kmsg_lines_total 1.0" in text else None

        text = await until(metrics_show_it)
        assert 'xid="79"' in text and "gpuhealth_gpu_xid_errors_total" in text
        assert 'gpuhealth_agent_source_up{source="sim"} 1.0' in text
        assert 'gpuhealth_agent_source_up{source="kmsg"} 1.0' in text
        assert 'gpuhealth_agent_source_up{source="podresources"} 0.0' in text
        assert 'gpuhealth_agent_poll_duration_seconds_count{source="sim"}' in text
        async with http.get(f"{base}/healthz") as r:
            assert r.status == 200
    finally:
        await app.stop()

    # a restart on the same boot keeps the latched verdict, before any source speaks
    again = build_agent(cfg, sources=[], boot_id="boot-e2e")
    again.driver.restore_latched()
    states = {s.info.index: s.state for s in again.snapshot().statuses}
    assert "unhealthy" in states.values()


class FlakySource:
    """Fails on its first run, then idles: the agent must count it, restart it, keep serving."""

    name: SourceName = "dcgm"

    def __init__(self) -> None:
        self.runs = 0
        self.up = False
        self.ready = False
        self.errors = 0
        self.polls: Histogram | None = None
        self.counters = Counters()

    async def run(self, sink: ObservationSink) -> None:
        self.runs += 1
        if self.runs == 1:
            raise RuntimeError("dcgm-exporter refused the connection")
        self.up = self.ready = True
        await asyncio.Event().wait()


async def test_failing_source_is_reported_and_restarted(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    app = build_agent(_config(tmp_path, kmsg_path="none"), sources=[FlakySource()], boot_id="b")
    app.supervisor.policy = RestartPolicy(initial_s=0.01)
    try:
        base = await _started(app)

        async def counted() -> str | None:
            async with http.get(f"{base}/metrics") as r:
                text = await r.text()
            return (
                text if 'gpuhealth_agent_source_errors_total{source="dcgm"} 1.0' in text else None
            )

        text = await until(counted)
        assert 'gpuhealth_agent_source_up{source="dcgm"} 0.0' in text
        async with http.get(f"{base}/healthz") as r:
            assert r.status == 200  # a failing source never fails the liveness probe
        await until(lambda: _ok(app))
        async with http.get(f"{base}/healthz") as r:
            assert r.status == 200
    finally:
        await app.stop()


async def _ok(app: AgentApp) -> bool:
    return bool(app.supervisor.status()["source-dcgm"]["running"])


async def test_transitions_reach_the_stream_outbox(tmp_path: Path) -> None:
    """With a controller URL, every transition is appended to the durable outbox even while
    the controller is unreachable (it is replayed after the connection comes up)."""
    token = tmp_path / "token"
    token.write_text("t0ken")
    cfg = _config(
        tmp_path,
        kmsg_path="none",
        controller_url="ws://127.0.0.1:9/v1/stream",
        token_file=str(token),
    )
    app = build_agent(cfg, boot_id="b")
    try:
        await _started(app)
        assert "stream-connection" in app.supervisor.status()

        async def queued() -> bool:
            return app.parts.stream.metrics.outbox_messages >= 2  # unknown -> healthy, per GPU

        await until(queued)
        assert not app.parts.stream.metrics.connected
    finally:
        await app.stop()


class _Kubelet(api_pb2_grpc.PodResourcesListerServicer):
    """A kubelet's PodResources List on the real v1 proto; tests set ``pods``."""

    def __init__(self) -> None:
        self.pods: list[Any] = []

    async def List(self, request: Any, context: Any) -> Any:
        return api_pb2.ListPodResourcesResponse(pod_resources=self.pods)


@pytest.fixture
async def kubelet() -> AsyncIterator[tuple[_Kubelet, Path]]:
    """A kubelet PodResources server on a unix socket (short path: sun_path is 108 bytes)."""
    with tempfile.TemporaryDirectory(prefix="e2e-") as d:
        tmp = Path(d)
        servicer = _Kubelet()
        server = grpc.aio.server()
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
        server.add_insecure_port(f"unix://{tmp / 'kubelet.sock'}")
        await server.start()
        try:
            yield servicer, tmp
        finally:
            await server.stop(None)


def _one_gpu_pod(device_id: str) -> Any:
    return api_pb2.PodResources(
        namespace="ml",
        name="train-0",
        containers=[
            api_pb2.ContainerResources(
                name="worker",
                devices=[
                    api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[device_id])
                ],
            )
        ],
    )


async def test_pod_labels_from_kubelet_podresources(
    http: aiohttp.ClientSession, kubelet: tuple[_Kubelet, Path]
) -> None:
    """A kubelet PodResources server (real v1 proto, unix socket): its allocations show up as
    namespace/pod/container labels on the GPU's series, refreshed on the interval."""
    servicer, tmp = kubelet
    cfg = _config(
        tmp,
        kmsg_path="none",
        podresources={"socket": str(tmp / "kubelet.sock"), "refresh_interval_s": 0.05},
    )
    app = build_agent(cfg, boot_id="b")
    try:
        base = await _started(app)

        async def gpus() -> list[dict[str, Any]] | None:
            async with http.get(f"{base}/api/v1/status") as r:
                body = await r.json()
            return body["gpus"] or None

        target = (await until(gpus))[1]["uuid"]
        servicer.pods = [_one_gpu_pod(f"{target}::0")]

        async def labelled() -> str | None:
            async with http.get(f"{base}/metrics") as r:
                text = await r.text()
            want = 'container="worker",gpu="1"'
            return text if want in text and 'pod="train-0"' in text else None

        text = await until(labelled)
        assert 'gpuhealth_agent_source_up{source="podresources"} 1.0' in text
        line = next(
            ln
            for ln in text.splitlines()
            if ln.startswith("gpuhealth_gpu_power_watts{") and 'gpu="1"' in ln
        )
        assert 'namespace="ml"' in line and f'uuid="{target}"' in line
        assert [a.device_id for a in app.snapshot().allocations] == [f"{target}::0"]
    finally:
        await app.stop()


async def test_a_pod_starting_later_reaches_the_controller_in_a_snapshot(
    kubelet: tuple[_Kubelet, Path],
) -> None:
    """Events carry health only: when the kubelet's allocations change, the agent queues a
    fresh Snapshot so the controller (idle detection, extender) learns of the new pod."""
    servicer, tmp = kubelet
    token = tmp / "token"
    token.write_text("t0ken")
    cfg = _config(
        tmp,
        kmsg_path="none",
        controller_url="ws://127.0.0.1:9/v1/stream",
        token_file=str(token),
        podresources={"socket": str(tmp / "kubelet.sock"), "refresh_interval_s": 0.05},
    )
    app = build_agent(cfg, boot_id="b")
    outbox = app.parts.outbox
    assert outbox is not None

    def snapshots() -> list[Snapshot]:
        msgs = [decode_agent(e.frame) for e in outbox.entries()]
        return [m for m in msgs if isinstance(m, Snapshot)]

    try:
        await _started(app)

        async def polled() -> bool:
            return bool(app.snapshot().statuses)

        await until(polled)
        assert snapshots() == []  # controller unreachable, no allocation change yet
        uuid = app.snapshot().statuses[1].info.uuid
        servicer.pods = [_one_gpu_pod(uuid)]

        async def queued() -> list[Snapshot]:
            return [s for s in snapshots() if s.allocations]

        (snap,) = await until(queued)
        assert [(a.pod, a.gpu_uuid) for a in snap.allocations] == [("train-0", uuid)]
    finally:
        await app.stop()
