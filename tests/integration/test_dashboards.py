"""Grafana dashboards: well-formed, templated, and every panel query parses and returns data
from a real Prometheus scraping simulated agents and a controller.

The live test starts, as subprocesses: two ``gpuhealth-agent --source sim`` (the demo
scenario: XID 79, a DBE, a hot GPU) streaming to one ``gpuhealth-controller`` that runs
against the test kube-apiserver (real Nodes, bound ServiceAccount tokens; a third GPU Node
without an agent, an open incident), and Debian's ``prometheus`` scraping all three every
second with the alert rules loaded.
"""

from __future__ import annotations

import json
import os
import re
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from gpuhealth.agent.podresources._pb import api_pb2, api_pb2_grpc
from gpuhealth.agent.sources.sim.scenario import load_scenario
from gpuhealth.agent.sources.sim.source import SimSource
from localkube import ControlPlane
from localkube.objects import gpu_node_body, pod_body
from localkube.process import free_port
from tests.integration.tooling import require
from tests.support.clock import FakeClock
from tests.support.wait import until_sync

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((ROOT / "dashboards").glob("*.json"))
METRICS_DOC = ROOT / "docs" / "metrics.md"
RULES = ROOT / "deploy" / "prometheus" / "rules.yaml"
SCENARIO = ROOT / "examples" / "scenarios" / "demo.yaml"
BIN = Path(sys.executable).parent
AGENT_NAMESPACE = "gpuhealth"
AGENT_SERVICE_ACCOUNT = "gpuhealth-agent"
TOKEN_AUDIENCE = "gpuhealth"
STARTUP_TIMEOUT_S = 60.0
DATA_TIMEOUT_S = 90.0
"""The demo scenario injects its faults 10-20 s after start; scrapes run every second."""
SUBSTITUTIONS = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "1h",
    "$node": ".*",
    "$gpu": ".*",
}
IDLE_NAMESPACE = "ml-training"
IDLE_SETTINGS = {"window_s": 3.0, "evaluate_interval_s": 1.0}
"""Short idle window so that the demo's 1%-utilised GPU 6 becomes an idle allocation."""
UNWATCHED_SETTINGS = {"grace_s": 3.0, "check_interval_s": 1.0}
"""Short grace so that a GPU node without an agent is an open incident (the incident panels)."""


def _targets(dashboard: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield dashboard["uid"], panel["title"], target["expr"]


def _expand(expr: str) -> str:
    for var in sorted(SUBSTITUTIONS, key=len, reverse=True):
        expr = expr.replace(var, SUBSTITUTIONS[var])
    return expr


def _documented_metrics() -> set[str]:
    names: set[str] = set()
    for line in METRICS_DOC.read_text().splitlines():
        if line.startswith("| `gpuhealth_"):
            names.update(re.findall(r"`(gpuhealth_[a-z0-9_]+)`", line.split("|")[1]))
    return names


ALL_TARGETS = [t for path in DASHBOARDS for t in _targets(json.loads(path.read_text()))]


# ---------------------------------------------------------------- static checks


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_dashboard_is_templated(path: Path) -> None:
    dashboard = json.loads(path.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert "node" in variables
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        assert panel.get("description"), f"{panel['title']}: panels explain themselves"
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"


def test_chart_copies_are_identical() -> None:
    copies = ROOT / "deploy" / "helm" / "gpuhealth" / "files" / "dashboards"
    assert sorted(p.name for p in copies.glob("*.json")) == [p.name for p in DASHBOARDS]
    for path in DASHBOARDS:
        assert (copies / path.name).read_bytes() == path.read_bytes(), (
            f"run: cp dashboards/*.json {copies.relative_to(ROOT)}/"
        )


def test_there_is_a_fleet_overview_and_a_drill_down() -> None:
    uids = {json.loads(p.read_text())["uid"] for p in DASHBOARDS}
    assert uids == {"gpuhealth-fleet", "gpuhealth-node"}
    node = json.loads((ROOT / "dashboards" / "gpuhealth-node.json").read_text())
    assert {v["name"] for v in node["templating"]["list"]} == {"datasource", "node", "gpu"}


@pytest.mark.parametrize(("uid", "title", "expr"), ALL_TARGETS)
def test_queries_use_documented_metrics(uid: str, title: str, expr: str) -> None:
    documented = _documented_metrics()
    for name in re.findall(r"\bgpuhealth_[a-z0-9_]+", expr):
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        assert name in documented or base in documented, f"{uid}/{title}: {name}"


# ---------------------------------------------------------------- live stack


@dataclass
class Kube:
    url: str
    context: ssl.SSLContext

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, context=self.context, timeout=30) as resp:
                return json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            if exc.code == 409 and method == "POST":
                return None
            raise AssertionError(f"{method} {path}: {exc.code} {exc.read()[:500]!r}") from exc


class FakeKubelet(api_pb2_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    """The kubelet's PodResources v1 List (the real proto): every GPU held by one pod."""

    def __init__(self, node: str, gpu_uuids: list[str]) -> None:
        self.node = node
        self.gpu_uuids = gpu_uuids

    def List(self, request: object, context: object) -> object:
        return api_pb2.ListPodResourcesResponse(
            pod_resources=[
                api_pb2.PodResources(
                    namespace=IDLE_NAMESPACE,
                    name=f"trainer-{self.node}-{i}",
                    containers=[
                        api_pb2.ContainerResources(
                            name="main",
                            devices=[
                                api_pb2.ContainerDevices(
                                    resource_name="nvidia.com/gpu", device_ids=[uuid]
                                )
                            ],
                        )
                    ],
                )
                for i, uuid in enumerate(self.gpu_uuids)
            ]
        )


def _sim_uuids() -> list[str]:
    """The GPU UUIDs the simulator reports for the demo scenario (seed 0, deterministic)."""
    return [g.uuid for g in SimSource(load_scenario(SCENARIO), FakeClock(), 0).inventory().gpus]


@dataclass
class Stack:
    prometheus_url: str
    nodes: list[str]
    logs: dict[str, Path] = field(default_factory=dict)

    def query(self, expr: str) -> dict[str, Any]:
        url = f"{self.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return dict(json.loads(resp.read()))
        except urllib.error.HTTPError as exc:
            return dict(json.loads(exc.read()))

    def diagnostics(self) -> str:
        tails = []
        for name, path in self.logs.items():
            text = path.read_text(errors="replace") if path.exists() else ""
            tails.append(f"--- {name} ---\n" + "\n".join(text.splitlines()[-15:]))
        return "\n".join(tails)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def _controller_config(namespace: str, lease: str) -> dict[str, Any]:
    return {
        "leader": {"namespace": namespace, "lease_name": lease},
        "breaker": {"configmap": f"{lease}-breaker"},
        "http": {"auth": {"reads": "open"}},  # Prometheus scrapes without a token here
        "idle": IDLE_SETTINGS,
        "incidents": {"unwatched": UNWATCHED_SETTINGS},
        "stream": {
            "audience": TOKEN_AUDIENCE,
            "agent_namespace": AGENT_NAMESPACE,
            "agent_service_account": AGENT_SERVICE_ACCOUNT,
        },
    }


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    prometheus = require("prometheus", hint="hack/system-deps.sh installs Debian's prometheus")
    for entry in ("gpuhealth-agent", "gpuhealth-controller"):
        if not (BIN / entry).exists():
            pytest.fail(f"{BIN / entry} is missing (pip install -e .)", pytrace=False)

    work = tmp_path_factory.mktemp("dashboards")
    context = ssl.create_default_context(cafile=str(control_plane.ca_cert))
    context.load_cert_chain(str(control_plane.pki.admin_cert), str(control_plane.pki.admin_key))
    kube = Kube(control_plane.url, context)
    suffix = os.urandom(3).hex()
    nodes = [f"dash-gpu-{i}-{suffix}" for i in range(2)]
    stack = Stack(prometheus_url="", nodes=nodes)
    procs: list[subprocess.Popen[bytes]] = []
    kubelets: list[grpc.Server] = []

    def start(name: str, argv: list[str]) -> None:
        log = work / f"{name}.log"
        stack.logs[name] = log
        with log.open("wb") as out:
            procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT))

    ns = AGENT_NAMESPACE
    kube.call("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    kube.call(
        "POST",
        f"/api/v1/namespaces/{ns}/serviceaccounts",
        {"metadata": {"name": AGENT_SERVICE_ACCOUNT}},
    )
    tokens: dict[str, Path] = {}
    lonely = f"dash-lonely-{suffix}"  # a GPU node no agent reports for: an unwatched incident
    kube.call("POST", "/api/v1/nodes", gpu_node_body(lonely, kwok=False))
    for node in nodes:
        kube.call("POST", "/api/v1/nodes", gpu_node_body(node, kwok=False))
        pod = kube.call(
            "POST",
            f"/api/v1/namespaces/{ns}/pods",
            pod_body(f"agent-{node}", node_name=node, service_account=AGENT_SERVICE_ACCOUNT),
        )
        review = kube.call(
            "POST",
            f"/api/v1/namespaces/{ns}/serviceaccounts/{AGENT_SERVICE_ACCOUNT}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {
                    "audiences": [TOKEN_AUDIENCE],
                    "expirationSeconds": 3600,
                    "boundObjectRef": {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": pod["metadata"]["name"],
                        "uid": pod["metadata"]["uid"],
                    },
                },
            },
        )
        tokens[node] = work / f"{node}.token"
        tokens[node].write_text(review["status"]["token"])

    controller_port = free_port()
    config = work / "controller.yaml"
    config.write_text(yaml.safe_dump(_controller_config(ns, f"dash-lease-{suffix}")))
    start(
        "controller",
        [
            str(BIN / "gpuhealth-controller"),
            f"--kubeconfig={control_plane.kubeconfig}",
            f"--listen=127.0.0.1:{controller_port}",
            f"--config={config}",
        ],
    )
    agent_ports = {node: free_port() for node in nodes}
    uuids = _sim_uuids()
    for node in nodes:
        state = work / f"state-{node}"
        state.mkdir()
        socket = work / f"kubelet-{node}.sock"
        kubelet = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(FakeKubelet(node, uuids), kubelet)
        kubelet.add_insecure_port(f"unix://{socket}")
        kubelet.start()
        kubelets.append(kubelet)
        start(
            f"agent-{node}",
            [
                str(BIN / "gpuhealth-agent"),
                "--source=sim",
                f"--sim-scenario={SCENARIO}",
                "--kmsg-path=none",
                f"--podresources-socket={socket}",
                f"--listen=127.0.0.1:{agent_ports[node]}",
                f"--node-name={node}",
                f"--controller-url=ws://127.0.0.1:{controller_port}/v1/stream",
                f"--token-file={tokens[node]}",
                f"--state-dir={state}",
            ],
        )

    # An impostor: the token of the first node, claiming the second. The controller must
    # refuse it (node_mismatch) on every reconnect, which feeds the rejection panel.
    impostor_state = work / "state-impostor"
    impostor_state.mkdir()
    start(
        "agent-impostor",
        [
            str(BIN / "gpuhealth-agent"),
            "--source=sim",
            "--kmsg-path=none",
            "--podresources-socket=none",
            f"--listen=127.0.0.1:{free_port()}",
            f"--node-name={nodes[1]}",
            f"--controller-url=ws://127.0.0.1:{controller_port}/v1/stream",
            f"--token-file={tokens[nodes[0]]}",
            f"--state-dir={impostor_state}",
        ],
    )

    prom_port = free_port()
    prom_config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {
                "job_name": "gpuhealth-agent",
                "honor_labels": True,
                "static_configs": [
                    {"targets": [f"127.0.0.1:{agent_ports[n]}"], "labels": {"node": n}}
                    for n in nodes
                ],
            },
            {
                "job_name": "gpuhealth-controller",
                "static_configs": [{"targets": [f"127.0.0.1:{controller_port}"]}],
            },
        ],
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(prom_config))
    start(
        "prometheus",
        [
            prometheus,
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
            "--web.enable-lifecycle",
        ],
    )
    stack.prometheus_url = f"http://127.0.0.1:{prom_port}"
    try:
        until_sync(
            lambda: _http_ok(f"{stack.prometheus_url}/-/ready"),
            "prometheus",
            timeout_s=30,
            interval_s=0.25,
            diagnostics=stack.diagnostics,
        )
        until_sync(
            lambda: _http_ok(f"http://127.0.0.1:{controller_port}/readyz"),
            "the controller to lead (/readyz)",
            timeout_s=STARTUP_TIMEOUT_S,
            interval_s=0.25,
            diagnostics=stack.diagnostics,
        )
        for node in nodes:
            until_sync(
                lambda n=node: _http_ok(f"http://127.0.0.1:{agent_ports[n]}/readyz"),
                f"agent {node}",
                timeout_s=STARTUP_TIMEOUT_S,
                interval_s=0.25,
                diagnostics=stack.diagnostics,
            )
        yield stack
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for kubelet in kubelets:
            kubelet.stop(grace=None)
        for node in nodes:
            kube.call("DELETE", f"/api/v1/namespaces/{ns}/pods/agent-{node}?gracePeriodSeconds=0")
            kube.call("DELETE", f"/api/v1/nodes/{node}")
        kube.call("DELETE", f"/api/v1/nodes/{lonely}")


def _wait_for_series(stack: Stack, exprs: list[str], timeout_s: float) -> dict[str, Any]:
    """Poll until every query returns data (or the deadline); the last answer per query."""
    answers: dict[str, Any] = {}
    pending = list(exprs)
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        for expr in list(pending):
            answers[expr] = stack.query(expr)
            if answers[expr].get("status") == "success" and answers[expr]["data"]["result"]:
                pending.remove(expr)
        if pending:
            time.sleep(1.0)
    for expr in pending:
        answers[expr] = stack.query(expr)
    return answers


def test_every_panel_query_returns_data(stack: Stack) -> None:
    exprs = sorted({_expand(expr) for _, _, expr in ALL_TARGETS})
    answers = _wait_for_series(stack, exprs, DATA_TIMEOUT_S)
    problems = []
    for uid, title, raw in ALL_TARGETS:
        expr = _expand(raw)
        answer = answers[expr]
        if answer.get("status") != "success":
            problems.append(f"{uid}/{title}: does not parse: {answer.get('error')}\n  {expr}")
        elif not answer["data"]["result"]:
            problems.append(f"{uid}/{title}: no data\n  {expr}")
    assert problems == [], "\n".join(problems) + "\n" + stack.diagnostics()


def test_template_variables_resolve(stack: Stack) -> None:
    url = f"{stack.prometheus_url}/api/v1/series?" + urllib.parse.urlencode(
        {"match[]": "gpuhealth_gpu_info"}
    )
    with urllib.request.urlopen(url, timeout=10) as resp:
        series = json.loads(resp.read())["data"]
    assert {s["node"] for s in series} >= set(stack.nodes)
    assert {s["gpu"] for s in series} == {str(i) for i in range(8)}


def test_the_idle_gpu_of_the_demo_is_an_idle_allocation(stack: Stack) -> None:
    """GPU 6 runs at 1% in the demo; the controller (3 s idle window here) flags it."""
    expr = f'max by (node, gpu) (gpuhealth_idle_allocation{{namespace="{IDLE_NAMESPACE}"}}) == 1'
    expected = {(node, "6") for node in stack.nodes}
    answer = _wait_for_series(stack, [expr], DATA_TIMEOUT_S)[expr]
    deadline = time.monotonic() + DATA_TIMEOUT_S
    while True:  # each agent's first heartbeat starts its own window: they converge apart
        idle = {(r["metric"]["node"], r["metric"]["gpu"]) for r in answer["data"]["result"]}
        if expected <= idle or time.monotonic() > deadline:
            break
        time.sleep(1.0)
        answer = stack.query(expr)
    assert expected <= idle, (answer, stack.diagnostics())


def test_impostor_is_refused_for_node_mismatch(stack: Stack) -> None:
    expr = 'sum(gpuhealth_stream_rejected_total{reason="node_mismatch"})'
    answer = _wait_for_series(stack, [expr], DATA_TIMEOUT_S)[expr]
    assert answer["data"]["result"], stack.diagnostics()
    assert float(answer["data"]["result"][0]["value"][1]) >= 1


def test_demo_faults_fire_their_alerts(stack: Stack) -> None:
    """The rules, loaded into the same Prometheus, fire on the simulated faults."""
    expected = {"GPUFallenOffBus", "GPUXidFatal", "GPUEccUncorrectable"}
    expr = 'count by (alertname) (ALERTS{alertstate="firing"})'
    answers = _wait_for_series(stack, [expr], DATA_TIMEOUT_S)
    deadline = time.monotonic() + DATA_TIMEOUT_S
    firing: set[str] = set()
    while time.monotonic() < deadline:
        result = stack.query(expr)["data"]["result"]
        firing = {r["metric"]["alertname"] for r in result}
        if expected <= firing:
            break
        time.sleep(1.0)
    assert expected <= firing, (answers, stack.diagnostics())
    assert "GPUHealthControllerNoLeader" not in firing
