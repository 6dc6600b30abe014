"""Placement as users run it: kube-scheduler with the shipped extender configuration
(deploy/scheduler/scheduler-config.yaml: HTTPS, ignorable) calling a real
``gpuhealth-controller`` process over TLS (the chart's configuration, ServiceAccount and RBAC,
every HTTP middleware), fed by real ``gpuhealth-agent`` processes (simulated GPUs) over the
authenticated stream, verifying the controller's certificate.

One node's agent reports an XID 79 on one of its GPUs, another's GPUs run hot and busy, a third
is cool and idle. Pods tolerate every taint, so only the extender can keep them off the
unhealthy node (the filter) and steer them to the cool node (the scores): without the extender,
kube-scheduler's own scoring would pick the node the pod prefers by affinity, or spread them.
"""

from __future__ import annotations

import ssl
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
import yaml
from kubernetes_asyncio import client
from prometheus_client.parser import text_string_to_metric_families

from demo.procs import REPO_ROOT
from localkube import ControlPlane
from localkube.kwok import Kwok
from localkube.objects import create_gpu_node, create_namespace, pod_body, wait_for
from localkube.process import ManagedProcess, free_port
from localkube.scheduler import Scheduler
from tests.integration.controller_helpers import Cluster, cluster, controller_process
from tests.integration.test_placement import extender_config
from tests.support.wait import until

pytestmark = pytest.mark.integration

WAIT_S = 60.0
GPUS = 2
"""GPUs of a node (the filter test's pod asks for both)."""
AGENT = {"log_format": "json", "tick_interval_s": 0.2, "stream": {"heartbeat_interval_s": 1}}
FOREVER = 3600
PODS = 3
"""One-GPU pods the scoring test places one after the other."""


def _all_gpus(**fault: Any) -> list[dict[str, Any]]:
    return [{"at": 0, "gpu": i, **fault, "for": FOREVER} for i in range(GPUS * 2)]


BROKEN = [{"at": 0, "gpu": 1, "xid": 79, "message": "GPU has fallen off the bus."}]
"""One GPU of two fell off the bus: unhealthy."""
HOT = _all_gpus(temperature=87) + _all_gpus(utilization=0.99)
"""Every GPU 2 degrees below its slowdown temperature and saturated."""
COOL = _all_gpus(utilization=0.02)
"""Every GPU idle and cool."""


@dataclass
class Product:
    """The controller process, its agents and the test's nodes and pods."""

    kube: Cluster
    core: client.CoreV1Api
    base: str
    """The controller's URL (HTTPS)."""
    trusted: ssl.SSLContext
    """Trusts the CA that issued the controller's certificate (``tmp/ca.crt``)."""
    tmp: Path
    ns: str
    pin: dict[str, str]
    agents: list[ManagedProcess] = field(default_factory=list)

    async def node(self, name: str, faults: list[dict[str, Any]], gpus: int = GPUS) -> str:
        """A kwok GPU node whose agent process reports ``faults`` (simulated GPUs)."""
        faults = [f for f in faults if f["gpu"] < gpus]
        await create_gpu_node(self.kube.api, name, gpus=gpus, labels=self.pin)
        self.kube.nodes.append(name)
        _, token = await self.kube.agent(name)
        token_file = self.tmp / f"{name}.token"
        token_file.write_text(token)
        token_file.chmod(0o600)
        scenario = {"name": name, "gpus": gpus, "poll_interval_s": 0.2, "faults": faults}
        files = {}
        for kind, doc in (("agent", AGENT), ("scenario", scenario)):
            files[kind] = self.tmp / f"{kind}-{name}.yaml"
            files[kind].write_text(yaml.safe_dump(doc))
        proc = ManagedProcess(
            f"agent-{name}",
            [
                sys.executable, "-m", "gpuhealth.agent.cli",
                "--config", str(files["agent"]), "--node-name", name, "--source", "sim",
                "--sim-scenario", str(files["scenario"]), "--kmsg-path", "none",
                "--listen", f"127.0.0.1:{free_port()}",
                "--controller-url", f"{self.base.replace('https', 'wss', 1)}/v1/stream",
                "--controller-ca-file", str(self.tmp / "ca.crt"),
                "--token-file", str(token_file), "--state-dir", str(self.tmp / f"state-{name}"),
                "--podresources-socket", str(self.tmp / "none.sock"),
            ],
            self.tmp / f"agent-{name}.log",
            REPO_ROOT,
        )  # fmt: skip
        proc.start()
        self.agents.append(proc)
        return name

    def session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.trusted))

    async def fleet_node(self, http: aiohttp.ClientSession, name: str) -> dict[str, Any] | None:
        async with http.get(f"{self.base}/api/v1/fleet") as r:
            doc = await r.json()
        found = [n for n in doc["nodes"] if n["name"] == name]
        return found[0] if found else None

    async def reported(
        self, http: aiohttp.ClientSession, name: str, check: Callable[..., bool]
    ) -> None:
        """Until the controller's fleet shows ``name`` connected and ``check(gpus)`` holds."""

        async def ok() -> bool:
            node = await self.fleet_node(http, name)
            return bool(node and node["connected"] and node["has_snapshot"] and check(node["gpus"]))

        await until(ok, f"{name} reported as expected", timeout_s=WAIT_S, interval_s=0.2)

    async def pod(self, name: str, gpus: int, scheduler: Scheduler, prefer: str = "") -> None:
        """A GPU pod tolerating every taint, preferring node ``prefer`` by affinity."""
        body = pod_body(
            name, gpus=gpus, node_selector=self.pin, scheduler_name=scheduler.scheduler_name
        )
        body["spec"]["tolerations"] = [{"operator": "Exists"}]
        if prefer:
            term = {"key": "kubernetes.io/hostname", "operator": "In", "values": [prefer]}
            body["spec"]["affinity"] = {
                "nodeAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 100, "preference": {"matchExpressions": [term]}}
                    ]
                }
            }
        await self.core.create_namespaced_pod(self.ns, body)

    async def bound_node(self, pod: str) -> str:
        async def bound() -> str | None:
            p = await self.core.read_namespaced_pod(pod, self.ns)
            return p.spec.node_name or None

        return await wait_for(bound, what=f"{pod} to be bound", timeout_s=WAIT_S)

    async def extender_requests(self, http: aiohttp.ClientSession) -> dict[tuple[str, str], float]:
        """``gpuhealth_extender_requests_total`` from the controller's /metrics."""
        async with http.get(f"{self.base}/metrics") as r:
            text = await r.text()
        return {
            (s.labels["verb"], s.labels["result"]): s.value
            for family in text_string_to_metric_families(text)
            if family.name == "gpuhealth_extender_requests"
            for s in family.samples
            if s.name.endswith("_total")
        }

    def scheduler_config(self) -> list[dict[str, object]]:
        """The shipped extender entry as shipped (HTTPS, ignorable), pointed at this
        controller and trusting the CA that issued its certificate."""
        url = f"{self.base}/scheduler"
        return [extender_config(url, ignorable=True, ca_file=self.tmp / "ca.crt")]


@pytest.fixture
async def product(
    control_plane: ControlPlane,
    kwok: Kwok,
    tmp_path: Path,
    unique_name: Callable[[str], str],
) -> AsyncIterator[Product]:
    async with cluster(control_plane) as kube:
        api = kube.api
        core = client.CoreV1Api(api)
        ns = unique_name("place")
        await create_namespace(api, ns)
        ca = trustme.CA()
        ca.cert_pem.write_to_path(str(tmp_path / "ca.crt"))
        trusted = ssl.create_default_context()
        ca.configure_trust(trusted)
        async with controller_process(kube, tmp_path, tls=ca) as (_, base):
            p = Product(kube, core, base, trusted, tmp_path, ns, {"gpuhealth.test/pin": ns})
            try:
                yield p
            finally:
                for agent in p.agents:
                    agent.stop(5.0)
                await core.delete_namespace(ns)


def _unhealthy(gpus: list[Mapping[str, Any]]) -> bool:
    return [g["state"] for g in gpus].count("unhealthy") == 1


def _hot(gpus: list[Mapping[str, Any]]) -> bool:
    return all((g.get("telemetry") or {}).get("temperature_c", 0) > 85 for g in gpus)


def _cool(gpus: list[Mapping[str, Any]]) -> bool:
    return all(0 < (g.get("telemetry") or {}).get("temperature_c", 99) < 45 for g in gpus)


async def test_the_real_controller_filters_the_unhealthy_node_for_kube_scheduler(
    product: Product,
    kube_scheduler: Callable[..., Scheduler],
    unique_name: Callable[[str], str],
) -> None:
    broken = await product.node(unique_name("broken"), BROKEN)
    hot = await product.node(unique_name("hot"), HOT)
    async with product.session() as http:
        await product.reported(http, broken, _unhealthy)
        await product.reported(http, hot, _hot)
        scheduler = kube_scheduler(
            extenders=product.scheduler_config(), scheduler_name=unique_name("sched")
        )
        # The pod prefers the broken node and tolerates its taint: only the filter (one usable
        # GPU there, the pod needs two) sends it to the hot node.
        await product.pod("two-gpus", GPUS, scheduler, prefer=broken)
        assert await product.bound_node("two-gpus") == hot
        requests = await product.extender_requests(http)
    assert requests.get(("filter", "ok"), 0) >= 1, requests
    assert requests.get(("filter", "bad_request"), 0) == 0, requests


async def test_the_real_controller_scores_the_cool_node_first(
    product: Product,
    kube_scheduler: Callable[..., Scheduler],
    unique_name: Callable[[str], str],
) -> None:
    # Room for every pod on every node: only the scores decide.
    hot = await product.node(unique_name("hot"), HOT, gpus=PODS)
    cool = await product.node(unique_name("cool"), COOL, gpus=PODS)
    hot2 = await product.node(unique_name("hot2"), HOT, gpus=PODS)
    async with product.session() as http:
        for name in (hot, hot2):
            await product.reported(http, name, _hot)
        await product.reported(http, cool, _cool)
        scheduler = kube_scheduler(
            extenders=product.scheduler_config(), scheduler_name=unique_name("sched")
        )
        # kube-scheduler's own scoring spreads pods (least allocated); the extender's scores
        # (weight 5 in the shipped configuration) keep every one on the cool node.
        for i in range(PODS):
            await product.pod(f"p{i}", 1, scheduler)
            assert await product.bound_node(f"p{i}") == cool
        requests = await product.extender_requests(http)
    assert requests.get(("prioritize", "ok"), 0) >= PODS, requests
    assert requests.get(("prioritize", "bad_request"), 0) == 0, requests


async def test_with_a_client_ca_only_a_scheduler_with_its_certificate_is_answered(
    control_plane: ControlPlane,
    kwok: Kwok,
    tmp_path: Path,
    unique_name: Callable[[str], str],
    kube_scheduler: Callable[..., Scheduler],
) -> None:
    """Mutual TLS for the extender (``extender.client_ca_file``): the real kube-scheduler
    presents a client certificate that CA signed (``extenders[].tlsConfig.certFile`` /
    ``keyFile``) and the filter keeps its pod off the broken node; a caller without a
    certificate gets 401 before its body is read (counted ``unauthenticated``), one with
    another CA's is refused at the handshake; agents (no certificate) stream as before."""
    schedulers, strangers = trustme.CA(), trustme.CA()
    schedulers.cert_pem.write_to_path(str(tmp_path / "schedulers.crt"))
    issued = schedulers.issue_cert("kube-scheduler")
    issued.cert_chain_pems[0].write_to_path(str(tmp_path / "scheduler.crt"))
    issued.private_key_pem.write_to_path(str(tmp_path / "scheduler.key"))
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.crt"))
    trusted = ssl.create_default_context()
    ca.configure_trust(trusted)
    mtls = {"extender": {"client_ca_file": str(tmp_path / "schedulers.crt")}}
    async with cluster(control_plane) as kube:
        core = client.CoreV1Api(kube.api)
        ns = unique_name("mtls")
        await create_namespace(kube.api, ns)
        async with controller_process(kube, tmp_path, mtls, tls=ca) as (_, base):
            p = Product(kube, core, base, trusted, tmp_path, ns, {"gpuhealth.test/pin": ns})
            try:
                broken = await p.node(unique_name("broken"), BROKEN)
                cool = await p.node(unique_name("cool"), COOL)
                async with p.session() as http:
                    await p.reported(http, broken, _unhealthy)  # agents: no certificate
                    await p.reported(http, cool, _cool)
                    async with http.post(f"{base}/scheduler/filter", json={}) as resp:
                        assert resp.status == 401
                        assert (await resp.json())["error"] == "client_certificate_required"
                    stranger = ssl.create_default_context()
                    ca.configure_trust(stranger)
                    strangers.issue_cert("intruder").configure_cert(stranger)
                    with pytest.raises(aiohttp.ClientError):
                        async with (
                            aiohttp.ClientSession() as s,
                            s.post(f"{base}/scheduler/filter", json={}, ssl=stranger) as resp,
                        ):
                            await resp.read()
                    config = [
                        extender_config(
                            f"{base}/scheduler",
                            ignorable=False,  # a refused call would leave the pod Pending
                            ca_file=tmp_path / "ca.crt",
                            client_cert=(tmp_path / "scheduler.crt", tmp_path / "scheduler.key"),
                        )
                    ]
                    scheduler = kube_scheduler(
                        extenders=config, scheduler_name=unique_name("sched")
                    )
                    await p.pod("two-gpus", GPUS, scheduler, prefer=broken)
                    assert await p.bound_node("two-gpus") == cool
                    requests = await p.extender_requests(http)
                assert requests.get(("filter", "ok"), 0) >= 1, requests
                assert requests.get(("filter", "unauthenticated"), 0) == 1, requests
            finally:
                for agent in p.agents:
                    agent.stop(5.0)
                await core.delete_namespace(ns)
