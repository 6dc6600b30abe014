"""HTTP endpoints with aiohttp's test client, from hand-built engine state."""

from __future__ import annotations

import json

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from gpuhealth.agent.metrics import make_registry
from gpuhealth.agent.node_snapshot import NodeSnapshotCache
from gpuhealth.agent.server import build_app, status_document
from gpuhealth.agent.stats import AgentStats
from gpuhealth.common.config import parse_listen
from gpuhealth.common.errors import ConfigError
from tests.support.agent import XID79, Tasks, engine_with, rail, status, uuid
from tests.support.clock import FakeClock


def _registry(st: NodeSnapshotCache) -> CollectorRegistry:
    return make_registry(st.snapshot, "t", AgentStats(Tasks({})))


def _state(n: int = 2) -> tuple[NodeSnapshotCache, object]:
    engine = engine_with(n)
    return NodeSnapshotCache("gpu-node-7", engine, FakeClock()), engine  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("state", "conditions", "expected_conditions"),
    [
        ("healthy", (), []),
        (
            "unhealthy",
            (XID79,),
            [
                {
                    "reason": "XidError",
                    "code": "xid-79",
                    "severity": "unhealthy",
                    "xid": 79,
                    "action": "RESTART_BM",
                    "message": "GPU has fallen off the bus",
                    "since": "2026-11-22T10:00:00Z",
                }
            ],
        ),
    ],
)
async def test_status_json_contract(
    state: str, conditions: tuple, expected_conditions: list
) -> None:
    st, engine = _state(1)
    engine.stat = [status(0, state, conditions)]  # type: ignore[attr-defined]
    async with TestClient(TestServer(build_app(st, _registry(st), lambda: True))) as c:
        resp = await c.get("/api/v1/status")
        assert resp.status == 200
        assert resp.content_type == "application/json"
        body = json.loads(await resp.read())
    assert body == {
        "node": "gpu-node-7",
        "gpus": [
            {
                "index": 0,
                "uuid": uuid(0),
                "pci_bus_id": "00000000:18:00.0",
                "model": "NVIDIA H100 80GB HBM3",
                "state": state,
                "conditions": expected_conditions,
            }
        ],
        "nics": [],
    }


def test_status_document_orders_gpus_by_index() -> None:
    st, engine = _state(3)
    engine.stat.reverse()  # type: ignore[attr-defined]
    assert [g["index"] for g in status_document(st.snapshot())["gpus"]] == [0, 1, 2]


async def test_readyz_waits_for_inventory_and_poll() -> None:
    st, engine = _state(1)
    inv = engine.inv  # type: ignore[attr-defined]
    engine.inv = None  # type: ignore[attr-defined]
    async with TestClient(TestServer(build_app(st, _registry(st), lambda: True))) as c:
        assert (await c.get("/readyz")).status == 503
        st.note_sample()
        assert (await c.get("/readyz")).status == 503
        engine.inv = inv  # type: ignore[attr-defined]
        assert (await c.get("/readyz")).status == 200


@pytest.mark.parametrize(("alive", "code"), [(True, 200), (False, 503)])
async def test_healthz(alive: bool, code: int) -> None:
    st, _ = _state(1)
    async with TestClient(TestServer(build_app(st, _registry(st), lambda: alive))) as c:
        assert (await c.get("/healthz")).status == code


async def test_metrics_endpoint() -> None:
    st, _ = _state(2)
    async with TestClient(TestServer(build_app(st, _registry(st), lambda: True))) as c:
        resp = await c.get("/metrics")
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = await resp.text()
    labels = (
        'container="",gpu="1",model="NVIDIA H100 80GB HBM3",namespace="",node="gpu-node-7",'
        f'pod="",state="healthy",uuid="{uuid(1)}"'
    )
    assert f"gpuhealth_gpu_health_state{{{labels}}} 1.0" in text


@pytest.mark.parametrize(
    ("listen", "expected"),
    [
        ("0.0.0.0:9455", ("0.0.0.0", 9455)),
        ("127.0.0.1:0", ("127.0.0.1", 0)),
        ("[::]:9455", ("::", 9455)),
        (":9455", ("0.0.0.0", 9455)),
    ],
)
def test_parse_listen(listen: str, expected: tuple[str, int]) -> None:
    assert parse_listen(listen) == expected


@pytest.mark.parametrize("listen", ["9455", "host:", "host:http", "h:70000"])
def test_parse_listen_rejects(listen: str) -> None:
    with pytest.raises(ConfigError):
        parse_listen(listen)


def test_status_document_shows_the_nic_ports() -> None:
    st, engine = _state(2)
    engine.nics = [rail()]  # type: ignore[attr-defined]
    (nic,) = status_document(st.snapshot())["nics"]
    assert nic["device"] == "mlx5_0" and nic["port"] == 1
    assert (nic["port_state"], nic["phys_state"], nic["rate_gbps"]) == ("ACTIVE", "LinkUp", 400.0)
    assert nic["gpus"] == [{"index": 0, "uuid": uuid(0)}, {"index": 1, "uuid": uuid(1)}]
    assert (nic["flaps"], nic["flaps_total"], nic["affinity"]) == (2, 5, "PIX")
    assert [v["code"] for v in nic["verdicts"]] == ["rail-flapping"]
    assert nic["verdicts"][0]["scope"] == "rail"
    assert nic["counters"] == {"link_downed": 255, "symbol_error": 17}
