"""Shared pieces of the controller integration tests: start controllers and read nodes back from
the real API server. Protocol messages come from ``tests.support.protocol``; a fleet is fed with
``tests.support.fleet``.

Controllers run as the chart's controller ServiceAccount with the chart's RBAC
(:mod:`tests.integration.chart_identity`, one release per test: :attr:`Cluster.release`), so
every test that drives one proves least privilege end to end; the test itself (nodes, pods,
checks) uses the admin client :attr:`Cluster.api`."""

from __future__ import annotations

import asyncio
import os
import ssl
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import aiohttp
import trustme
import yaml

from gpuhealth.controller.app import Controller
from gpuhealth.controller.compose import build_controller
from gpuhealth.controller.kube.client import make_api_client
from gpuhealth.controller.kube.rest import ApiClient, ConflictError, NotFoundError, request
from gpuhealth.controller.settings import load_config
from localkube import ControlPlane
from localkube.objects import gpu_node_body
from localkube.process import free_port
from tests.integration.chart_identity import ChartRelease, install_identity
from tests.integration.remediation_helpers import install_crd
from tests.support.wait import until

PREFIX = "gpuhealth.io"
UNHEALTHY = f"{PREFIX}/unhealthy"
EXCLUDE = f"node-restriction.kubernetes.io/{PREFIX}-exclude"
"""The operator's exclude label (a node's own kubelet may not set it)."""
OPT_OUT = f"node-restriction.kubernetes.io/{PREFIX}-remediation"
"""The operator's remediation opt-out label."""

OPEN_READS = {"http": {"auth": {"reads": "open"}}}
"""The tests read the fleet API, the overview and /metrics without a token; reads are
authorized by default (test_operator_auth.py proves that path, with the chart's roles)."""

FAST = {
    **OPEN_READS,
    "leader": {"enabled": False, "service": ""},
    "reconciler": {"backoff_base_s": 0.02, "backoff_max_s": 1.0, "resync_interval_s": 3600.0},
    "watch": {"relist_backoff_s": 0.2},
    "extender": {"enabled": False},
}


def merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


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


class Cluster:
    """Creates nodes and controllers for one test and removes them afterwards."""

    def __init__(self, cp: ControlPlane, api: ApiClient) -> None:
        self.cp = cp
        self.api = api
        self.nodes: list[str] = []
        self.controllers: list[tuple[Controller, ApiClient]] = []
        self._sentinel: str | None = None
        self._marks = 0
        self._release: ChartRelease | None = None
        self.chart_values: dict[str, Any] = {}
        """Values of the chart release the controllers' identity is rendered from."""
        self.clients: list[ApiClient] = []
        """Other API clients the test made (closed with the cluster)."""

    async def release(self) -> ChartRelease:
        """This test's chart release (created on first use): the controllers' identity, the
        namespace of their Lease and breaker ConfigMap, the agents' ServiceAccount; the
        chart's CRDs installed (the incidents are GPUIncidents, as with the chart)."""
        if self._release is None:
            await install_crd(self.api)
            self._release = await install_identity(self.cp, self.api, self.chart_values)
        return self._release

    async def agent(self, node: str) -> tuple[Any, str]:
        """An agent pod of the release on ``node`` and its bound token (audience gpuhealth)."""
        return await (await self.release()).agent(self.api, node)

    async def node(self, name: str, *, gpus: int = 2, kwok: bool = False, **kw: Any) -> str:
        """A GPU Node; ``kwok=True`` hands it to kwok (status heartbeats move its
        resourceVersion, as a kubelet's would)."""
        body = gpu_node_body(name, gpus=gpus, kwok=kwok, **kw)
        await request(self.api, "POST", "/api/v1/nodes", body=body)
        self.nodes.append(name)
        return name

    async def settle(self, ctl: Controller, timeout_s: float = 15.0) -> None:
        """Wait until ``ctl`` has nothing left to do, without a fixed sleep: its reconciler is
        idle, then its node watch has caught up with the API server (a mark written to a
        sentinel Node after that reaches its cache, so every earlier Node change, its own
        writes included, has too), then its reconciler is idle again."""
        await until(ctl.parts.reconciler.idle, "reconciler idle", timeout_s=timeout_s)
        if self._sentinel is None:
            self._sentinel = await self.node(f"sentinel-{uuid.uuid4().hex[:8]}", gpus=0)
        self._marks += 1
        mark = str(self._marks)
        await request(
            self.api,
            "PATCH",
            f"/api/v1/nodes/{self._sentinel}",
            body={"metadata": {"labels": {"gpuhealth-test/mark": mark}}},
            content_type="application/merge-patch+json",
        )

        def seen() -> bool:
            view = ctl.parts.cache.get(self._sentinel or "")
            return view is not None and view.labels.get("gpuhealth-test/mark") == mark

        await until(seen, "the node watch to catch up (sentinel mark)", timeout_s=timeout_s)
        await until(ctl.parts.reconciler.idle, "reconciler idle", timeout_s=timeout_s)

    async def controller(
        self, overrides: dict[str, Any] | None = None, *, identity: str | None = None
    ) -> Controller:
        """A controller with the chart's identity and configuration for this test's release
        (its own Lease and breaker ConfigMap), ``FAST`` timings and ``overrides`` on top."""
        release = await self.release()
        base = {**release.config, "kubeconfig": str(release.kubeconfig)}
        data = merge(merge(base, FAST), overrides or {})
        cfg = load_config(None, data)
        api = await make_api_client(cfg.kubeconfig)
        ctl = build_controller(cfg, api, identity=identity)
        self.controllers.append((ctl, api))
        await ctl.start()
        await asyncio.wait_for(ctl.parts.cache.synced.wait(), 15)
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
        for client in self.clients:
            await client.close()
        for name in self.nodes:
            with suppress(NotFoundError):
                await request(self.api, "DELETE", f"/api/v1/nodes/{name}")
        if self._release is not None:
            await self._release.delete(self.api)


@asynccontextmanager
async def cluster(cp: ControlPlane) -> AsyncIterator[Cluster]:
    api = await make_api_client(str(cp.kubeconfig))
    c = Cluster(cp, api)
    try:
        yield c
    finally:
        await c.close()
        await api.close()


@asynccontextmanager
async def controller_process(
    kube: Cluster,
    workdir: Path,
    overrides: dict[str, Any] | None = None,
    *,
    tls: trustme.CA | None = None,
    port: int | None = None,
    log_name: str = "controller.log",
) -> AsyncIterator[tuple[subprocess.Popen[bytes], str]]:
    """A real ``gpuhealth-controller`` process with the chart's identity and configuration for
    ``kube``'s release (``overrides`` on top), once it answers ``/readyz/replica``; yields the
    process and its base URL, kills it if the test did not stop it. With ``tls`` it serves
    HTTPS with a certificate for 127.0.0.1 that CA issued (``workdir/tls.crt``). It listens on
    ``port`` (a free one when None: a successor can take over its predecessor's address). Log:
    ``workdir/<log_name>``."""
    release = await kube.release()
    base_cfg = merge(release.config, {"leader": {"service": ""}, "log_format": "json"})
    base_cfg = merge(base_cfg, OPEN_READS)
    cfg_file = workdir / "controller.yaml"
    cfg_file.write_text(yaml.safe_dump(merge(base_cfg, overrides or {})))
    port = port or free_port()
    base = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "gpuhealth.controller.cli", "--kubeconfig"]
    argv += [str(release.kubeconfig), "--listen", f"127.0.0.1:{port}", "--config", str(cfg_file)]
    trusted: ssl.SSLContext | bool = True
    if tls is not None:
        cert = tls.issue_cert("127.0.0.1")
        cert.cert_chain_pems[0].write_to_path(str(workdir / "tls.crt"))
        cert.private_key_pem.write_to_path(str(workdir / "tls.key"))
        argv += ["--tls-cert-file", str(workdir / "tls.crt")]
        argv += ["--tls-key-file", str(workdir / "tls.key")]
        trusted = ssl.create_default_context()
        tls.configure_trust(trusted)
    with open(workdir / log_name, "wb") as log:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.DEVNULL,
            stderr=log,
            env={**os.environ, "PYTHONPATH": str(Path.cwd())},
        )
    try:
        async with aiohttp.ClientSession() as s:

            async def ready() -> bool | None:
                try:
                    async with s.get(f"{base}/readyz/replica", ssl=trusted) as resp:
                        return True if resp.status == 200 else None
                except aiohttp.ClientError:
                    return None

            await until(ready, "/readyz/replica 200", timeout_s=30)
        yield proc, base
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
