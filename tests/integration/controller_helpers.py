"""Shared pieces of the controller integration tests: start controllers, feed them protocol
messages through the IngestSink, read nodes back from the real API server."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from datetime import UTC, datetime
from typing import Any

from gpuhealth.controller.app import Controller
from gpuhealth.controller.config import load_config
from gpuhealth.controller.kube.client import make_api_client
from gpuhealth.controller.kube.rest import ApiClient, ConflictError, NotFoundError, request
from gpuhealth.protocol import Condition, Event, GpuInfo, GpuStatus, Hello, Snapshot
from localkube import ControlPlane
from localkube.objects import gpu_node_body, wait_for

PREFIX = "gpuhealth.io"
UNHEALTHY = f"{PREFIX}/unhealthy"
XID79 = Condition(
    reason="XidError", code="xid-79", severity="unhealthy", message="fell off the bus"
)
DBE = Condition(reason="EccUncorrectable", code="ecc-dbe", severity="unhealthy")
_seq = itertools.count(100)

FAST = {
    "leader": {"enabled": False},
    "reconciler": {"backoff_base_s": 0.02, "backoff_max_s": 1.0, "resync_interval_s": 3600.0},
    "watch": {"relist_backoff_s": 0.2},
    "extender": {"enabled": False},
}


def merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def gpu_uuid(node: str, i: int) -> str:
    return f"GPU-{abs(hash(node)) % 10**8:08d}-{i:04d}"


def hello(node: str, gpus: int = 2) -> Hello:
    return Hello(
        seq=next(_seq),
        node=node,
        stream_id="s1",
        boot_id="boot-1",
        agent_version="test",
        gpus=[GpuInfo(index=i, uuid=gpu_uuid(node, i)) for i in range(gpus)],
    )


def snapshot(node: str, states: dict[int, Condition | None], gpus: int = 2) -> Snapshot:
    """``states``: GPU index -> the condition making it unhealthy (absent or None: healthy)."""
    out = []
    for i in range(gpus):
        cond = states.get(i)
        out.append(
            GpuStatus(
                info=GpuInfo(index=i, uuid=gpu_uuid(node, i)),
                state="unhealthy" if cond else "healthy",
                conditions=[cond] if cond else [],
            )
        )
    return Snapshot(seq=next(_seq), node=node, taken_at=datetime.now(UTC), gpus=out)


def fault(node: str, gpu: int, cond: Condition = XID79) -> Event:
    return Event(
        seq=next(_seq),
        node=node,
        at=datetime.now(UTC),
        kind="transition",
        gpu_uuid=gpu_uuid(node, gpu),
        gpu_index=gpu,
        previous="healthy",
        current="unhealthy",
        conditions=[cond],
    )


def recover(node: str, gpu: int) -> Event:
    return Event(
        seq=next(_seq),
        node=node,
        at=datetime.now(UTC),
        kind="transition",
        gpu_uuid=gpu_uuid(node, gpu),
        gpu_index=gpu,
        previous="unhealthy",
        current="healthy",
    )


def report_healthy(ctl: Controller, node: str, gpus: int = 2) -> None:
    ctl.fleet.on_connect(node, hello(node, gpus))
    ctl.fleet.on_message(node, snapshot(node, {}, gpus))


async def get_node(api: ApiClient, name: str) -> dict[str, Any]:
    return await request(api, "GET", f"/api/v1/nodes/{name}")


def our_taints(node: dict[str, Any]) -> list[tuple[str, str, str]]:
    return sorted(
        (t["key"], t.get("value", ""), t["effect"])
        for t in node["spec"].get("taints") or []
        if t["key"].startswith(PREFIX + "/")
    )


def gpu_condition(node: dict[str, Any]) -> dict[str, Any] | None:
    for c in node["status"].get("conditions") or []:
        if c["type"] == "GPUHealthy":
            return dict(c)
    return None


async def until(check: Callable[[], Awaitable[Any]], what: str, timeout_s: float = 15.0) -> Any:
    return await wait_for(check, what=what, timeout_s=timeout_s, interval_s=0.05)


async def idle(ctl: Controller, timeout_s: float = 15.0) -> None:
    """Wait until the reconciler has nothing queued or in flight (twice, to let the watch
    deliver our own writes)."""
    for _ in range(2):
        await until(lambda: _true_or_none(ctl.reconciler.idle()), "reconciler idle", timeout_s)
        await asyncio.sleep(0.2)


async def _true_or_none(v: bool) -> bool | None:
    return True if v else None


class Cluster:
    """Creates nodes and controllers for one test and removes them afterwards."""

    def __init__(self, cp: ControlPlane, api: ApiClient) -> None:
        self.cp = cp
        self.api = api
        self.nodes: list[str] = []
        self.controllers: list[tuple[Controller, ApiClient]] = []

    async def node(self, name: str, *, gpus: int = 2, kwok: bool = False, **kw: Any) -> str:
        """A GPU Node; ``kwok=True`` hands it to kwok (status heartbeats move its
        resourceVersion, as a kubelet's would)."""
        body = gpu_node_body(name, gpus=gpus, kwok=kwok, **kw)
        await request(self.api, "POST", "/api/v1/nodes", body=body)
        self.nodes.append(name)
        return name

    async def controller(
        self, overrides: dict[str, Any] | None = None, *, identity: str | None = None
    ) -> Controller:
        base = {
            "kubeconfig": str(self.cp.kubeconfig),
            # a ConfigMap of its own: a breaker opened by one test must not reach another
            "breaker": {"configmap": f"breaker-{uuid.uuid4().hex[:8]}"},
        }
        data = merge(merge(base, FAST), overrides or {})
        cfg = load_config(None, data)
        api = await make_api_client(cfg.kubeconfig)
        ctl = Controller(cfg, api, identity=identity)
        self.controllers.append((ctl, api))
        await ctl.start()
        await asyncio.wait_for(ctl.cache.synced.wait(), 15)
        return ctl

    async def stop(self, ctl: Controller, *, crash: bool = False) -> None:
        """Stop a controller; ``crash`` skips giving the Lease up (as if the pod was killed)."""
        for i, (c, api) in enumerate(self.controllers):
            if c is ctl:
                if crash:
                    await c.supervisor.stop()
                else:
                    await c.stop()
                await api.close()
                del self.controllers[i]
                return

    async def namespace(self, name: str) -> None:
        with suppress(ConflictError):
            await request(
                self.api,
                "POST",
                "/api/v1/namespaces",
                body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
            )

    async def close(self) -> None:
        for ctl, api in reversed(self.controllers):
            await ctl.stop()
            await api.close()
        for name in self.nodes:
            with suppress(NotFoundError):
                await request(self.api, "DELETE", f"/api/v1/nodes/{name}")


@asynccontextmanager
async def cluster(cp: ControlPlane) -> AsyncIterator[Cluster]:
    api = await make_api_client(str(cp.kubeconfig))
    c = Cluster(cp, api)
    try:
        yield c
    finally:
        await c.close()
        await api.close()
