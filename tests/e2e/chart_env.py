"""The chart on a real node: values for a simulated GPU node, and what the tests look at
(pods, Lease, taints, the agent's and controller's HTTP endpoints on their pod IPs)."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from localkube.helm import Helm
from localkube.node import Node
from localkube.restapi import AdminApi

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpuhealth"
RELEASE = "gpuhealth"
NAMESPACE = "gpuhealth"
SEED = 7
GPUS = 4
PREFIX = "gpuhealth.io"
IDLE_WINDOW_S = 6.0
LEASE_DURATION_S = 6
SCENARIO: dict[str, Any] = {
    "name": "e2e",
    "gpus": GPUS,
    # Every GPU idle from the start: whichever the kubelet hands the workload is idle.
    "events": [{"at": 0, "gpu": i, "utilization": 0.01, "for": "2h"} for i in range(GPUS)],
}


READER_NAMESPACE = "e2e-readers"
READER = "reader"
"""A ServiceAccount the tests read the controller's fleet and /metrics with: reads are
authorized by default (``http.auth.reads``); the chart's ``controller.rbac.viewers`` binds it
to the viewer ClusterRole, a ClusterRole of the test's own grants ``get /metrics``."""
METRICS_READER = "e2e-metrics-reader"


def chart_values(node: Node, **overrides: Any) -> dict[str, Any]:
    """The chart's values for the test node: the image as `make image` names it (the chart's
    default repository and tag), simulated GPUs, the kernel log as a file, short windows."""
    kmsg = node.host_path("kmsg")
    kmsg.touch()
    values: dict[str, Any] = {
        "image": {"pullPolicy": "Never"},
        "agent": {
            "source": "sim",
            "simScenarioData": SCENARIO,
            "config": {
                "sim_seed": SEED,
                "podresources": {"refresh_interval_s": 1.0},
                "stream": {"heartbeat_interval_s": 1.0, "ack_timeout_s": 10.0},
            },
            "kmsg": {
                "hostPath": str(kmsg),
                "hostPathType": "File",
                "privileged": False,
            },
            "stateDir": {"hostPath": str(node.host_path("agent-state"))},
        },
        "controller": {
            "config": {
                "leader": {
                    "lease_duration_s": LEASE_DURATION_S,
                    "renew_deadline_s": 4.0,
                    "retry_period_s": 1.0,
                },
                "idle": {"window_s": IDLE_WINDOW_S, "evaluate_interval_s": 1.0},
            },
            "idle": {"annotatePods": True},
            "rbac": {
                "viewers": [
                    {"kind": "ServiceAccount", "name": READER, "namespace": READER_NAMESPACE}
                ]
            },
        },
    }
    return _merge(values, overrides)


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


CONTROLLER_HOST = f"{RELEASE}-controller.{NAMESPACE}.svc"
"""The controller Service's DNS name: what the chart's certificate is for."""


class _NamedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to an address, verifying the certificate for another name (a pod IP behind a
    Service)."""

    def __init__(self, host: str, port: int, server_name: str, ctx: ssl.SSLContext) -> None:
        super().__init__(host, port, timeout=5.0, context=ctx)
        self._server_name = server_name
        self._ctx = ctx

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self._ctx.wrap_socket(sock, server_hostname=self._server_name)


def wait_for(check: Callable[[], T | None], what: str, timeout_s: float = 120.0) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result is not None and result is not False:
            return result
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f}s waiting for {what}"
        time.sleep(0.1)


def http_json(url: str, timeout_s: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return json.loads(resp.read())


def http_text(url: str, timeout_s: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        text: str = resp.read().decode()
        return text


@dataclass
class Cluster:
    node: Node
    api: AdminApi
    helm: Helm
    _reader_token: str = ""

    def reader_token(self) -> str:
        """A token of the test's reader (:data:`READER`), made once: its namespace, its
        ServiceAccount, ``get /metrics`` (a ClusterRole and binding of its own; the fleet is
        the chart's viewer ClusterRole, bound by ``controller.rbac.viewers``)."""
        if self._reader_token:
            return self._reader_token
        rbac = "/apis/rbac.authorization.k8s.io/v1"
        objects = [
            ("/api/v1/namespaces", {"metadata": {"name": READER_NAMESPACE}}),
            (
                f"/api/v1/namespaces/{READER_NAMESPACE}/serviceaccounts",
                {"metadata": {"name": READER}},
            ),
            (
                f"{rbac}/clusterroles",
                {
                    "metadata": {"name": METRICS_READER},
                    "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}],
                },
            ),
            (
                f"{rbac}/clusterrolebindings",
                {
                    "metadata": {"name": METRICS_READER},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": METRICS_READER,
                    },
                    "subjects": [
                        {"kind": "ServiceAccount", "name": READER, "namespace": READER_NAMESPACE}
                    ],
                },
            ),
        ]
        for path, body in objects:
            if self.api.get(f"{path}/{body['metadata']['name']}") is None:
                self.api.request("POST", path, body)
        answer = self.api.request(
            "POST",
            f"/api/v1/namespaces/{READER_NAMESPACE}/serviceaccounts/{READER}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
        )
        self._reader_token = str(answer["status"]["token"])
        return self._reader_token

    def pods(self, component: str) -> list[dict[str, Any]]:
        selector = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component={component}"
        found = self.api.get(f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={selector}")
        return list(found["items"])

    def running(self, component: str) -> list[dict[str, Any]]:
        return [
            p
            for p in self.pods(component)
            if p["status"].get("phase") == "Running" and "deletionTimestamp" not in p["metadata"]
        ]

    def lease_holder(self) -> str | None:
        lease = self.api.get(
            f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{RELEASE}-controller"
        )
        holder: str | None = (lease or {}).get("spec", {}).get("holderIdentity")
        return holder

    def pod_ip(self, name: str) -> str:
        pod = self.api.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
        ip: str = pod["status"]["podIP"]
        return ip

    def fleet(self) -> dict[str, Any]:
        """The leader's /api/v1/fleet, over the chart's TLS (its generated CA, the certificate
        checked for the Service's name while dialling the pod's IP), with the reader's token
        (reads are authorized by default)."""
        holder = wait_for(self.lease_holder, "a leader")
        ca = self.api.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps/{RELEASE}-controller-ca")
        ctx = ssl.create_default_context(cadata=ca["data"]["ca.crt"])
        conn = _NamedHTTPSConnection(self.pod_ip(holder), 8080, CONTROLLER_HOST, ctx)
        try:
            token = self.reader_token()
            conn.request("GET", "/api/v1/fleet", headers={"Authorization": f"Bearer {token}"})
            resp = conn.getresponse()
            assert resp.status == 200, resp.status
            doc: dict[str, Any] = json.loads(resp.read())
        finally:
            conn.close()
        return doc

    def our_taints(self) -> list[dict[str, Any]]:
        node = self.api.get(f"/api/v1/nodes/{self.node.name}")
        return [t for t in node["spec"].get("taints", []) if t["key"].startswith(PREFIX + "/")]
