"""The remediation loop through the real processes: ``gpuhealth.controller.cli`` (remediation
on) and one ``gpuhealth.agent.cli`` per node (simulated GPUs) against the real API server.

:class:`Loop` starts them with short timeouts, lists the episodes, kills and restarts the
controller. Each test gets its own Lease (a controller of another test never leads here).
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from demo.cluster import agent_tokens, write_tokens
from demo.procs import REPO_ROOT
from gpuhealth.controller.kube.rest import request
from gpuhealth.controller.remediation.episode_store import PATH
from gpuhealth.controller.remediation.model import GROUP, PLURAL, VERSION
from localkube.process import ManagedProcess, free_port
from tests.integration.remediation_helpers import install_crd

QUARANTINE = "gpuhealth.io/remediation"

CONTROLLER_REMEDIATION: dict[str, Any] = {
    "enabled": True,
    "reset_gpu": {"enabled": True, "retry_s": 1, "order_timeout_s": 5},
    "reboot": {"enabled": True, "approval_required": False, "order_timeout_s": 5},
    "escalate": {"enabled": True},
    "drain": {"retry_s": 1, "timeout_s": 60},
    "validation": {"soak_s": 2, "report_grace_s": 10, "timeout_s": 60},
    "safety": {"max_concurrent": 5, "max_fraction": 1.0},
    "undelivered_retry_s": 1,
    "quarantine_check_s": 0.5,
    "resync_s": 2,
}

AGENT: dict[str, Any] = {
    "log_format": "json",
    "tick_interval_s": 0.2,
    "stream": {"heartbeat_interval_s": 1},
    "remediation": {
        "enabled": True,
        "validation": {"check_interval_s": 0.2},
        "allow_plaintext_orders": True,  # ws:// on 127.0.0.1
        "reboot": {"executor": "command", "delay_s": 0.2},
    },
}


def merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(base))
    for k, v in over.items():
        out[k] = merged(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out


def scenario(*faults: Mapping[str, Any], gpus: int = 2) -> dict[str, Any]:
    return {"name": "episode", "gpus": gpus, "poll_interval_s": 0.2, "seed": 7, "faults": faults}


XID48 = (
    {"at": 3, "gpu": 1, "dbe": 1},
    {"at": 3, "gpu": 1, "xid": 48, "message": "An uncorrectable double bit error"},
)
"""Double-bit ECC error: RESET_GPU."""
XID79 = (
    {"at": 3, "gpu": 1, "xid": 79, "message": "GPU has fallen off the bus."},
    {"at": 3, "gpu": 1, "lost": True},
)
"""Fallen off the bus: RESTART_BM (a reboot)."""


class Loop:
    def __init__(self, kubeconfig: Path, api: client.ApiClient, tmp_path: Path, lease: str) -> None:
        self.kubeconfig = kubeconfig
        self.api = api
        self.tmp = tmp_path
        self.lease = lease
        self.port = free_port()
        self.controllers: list[ManagedProcess] = []
        self.agents: dict[str, ManagedProcess] = {}
        self.tokens: dict[str, Path] = {}
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)

    async def prepare(self, nodes: list[str]) -> None:
        """The CRD, and an agent pod and bound token for each node (the nodes exist)."""
        await install_crd(self.api)
        self.tokens.update(write_tokens(await agent_tokens(self.api, nodes), self.tmp / "tokens"))

    def _write(self, name: str, doc: Mapping[str, Any]) -> Path:
        path = self.tmp / name
        path.write_text(yaml.safe_dump(doc))
        return path

    def controller_config(self, remediation: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "listen": f"127.0.0.1:{self.port}",
            "kubeconfig": str(self.kubeconfig),
            "log_format": "json",
            # Orders over plaintext on 127.0.0.1 (TLS itself: test_controller_tls.py).
            "allow_plaintext_orders": True,
            # The status CLI reads without a token (authorized reads: test_operator_auth.py).
            "http": {"auth": {"reads": "open"}},
            # Its own breaker ConfigMap: the stored window of another test's controller (the
            # same API server) would count that test's nodes against this one's budget.
            "breaker": {"max_fraction": 1.0, "configmap": f"{self.lease}-breaker"},
            "reconciler": {"resync_interval_s": 5},
            "leader": {
                "lease_name": self.lease,
                "lease_duration_s": 3,
                "renew_deadline_s": 2,
                "retry_period_s": 1,
            },
            "remediation": merged(CONTROLLER_REMEDIATION, remediation),
        }

    def start_controller(
        self, remediation: Mapping[str, Any] | None = None, **top: Any
    ) -> ManagedProcess:
        n = len(self.controllers)
        cfg = merged(self.controller_config(remediation or {}), top)
        proc = ManagedProcess(
            f"controller-{n}",
            [sys.executable, "-m", "gpuhealth.controller.cli",
             "--config", str(self._write(f"controller-{n}.yaml", cfg))],
            self.tmp / f"controller-{n}.log",
            REPO_ROOT,
        )  # fmt: skip
        proc.start()
        self.controllers.append(proc)
        return proc

    def start_agent(
        self, node: str, sim: Mapping[str, Any], agent: Mapping[str, Any] | None = None
    ) -> ManagedProcess:
        cfg = merged(AGENT, agent or {})
        proc = ManagedProcess(
            f"agent-{node}",
            [
                sys.executable, "-m", "gpuhealth.agent.cli",
                "--config", str(self._write(f"agent-{node}.yaml", cfg)),
                "--node-name", node, "--source", "sim",
                "--sim-scenario", str(self._write(f"scenario-{node}.yaml", dict(sim))),
                "--kmsg-path", "none", "--listen", f"127.0.0.1:{free_port()}",
                "--controller-url", f"ws://127.0.0.1:{self.port}/v1/stream",
                "--token-file", str(self.tokens[node]),
                "--state-dir", str(self.tmp / f"state-{node}"),
                "--podresources-socket", str(self.tmp / "none.sock"),
            ],
            self.tmp / f"agent-{node}.log",
            REPO_ROOT,
        )  # fmt: skip
        proc.start()
        self.agents[node] = proc
        return proc

    def stop(self) -> None:
        for p in [*self.agents.values(), *reversed(self.controllers)]:
            p.stop(5.0)

    async def episodes(self) -> list[dict[str, Any]] | None:
        """Every GPURemediation of this test's nodes; None while the new CRD's storage is not
        ready yet (429)."""
        try:
            items = (await self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL))["items"]
        except ApiException as exc:
            if exc.status == 429:
                return None
            raise
        return [i for i in items if i["spec"]["nodeName"] in self.agents]

    async def phase(self, node: str) -> tuple[str, str] | None:
        """(phase, reason) of the node's one episode; None without one."""
        eps = [e for e in await self.episodes() or [] if e["spec"]["nodeName"] == node]
        assert len(eps) <= 1, f"{len(eps)} episodes for {node}"
        if not eps:
            return None
        status = eps[0].get("status", {})
        return status.get("phase", ""), status.get("reason", "")

    async def annotate(self, name: str, key: str, value: str) -> None:
        """An operator's annotation on the episode (approve, abort, release)."""
        await request(
            self.api,
            "PATCH",
            f"{PATH}/{name}",
            body={"metadata": {"annotations": {key: value}}},
            content_type="application/merge-patch+json",
        )

    async def taint_keys(self, node: str) -> set[str]:
        return {t.key for t in (await self.core.read_node(node)).spec.taints or []}

    def logs(self) -> str:
        parts = [f"{p.name}:\n{p.log_tail(30)}" for p in self.controllers[-2:]]
        parts += [f"{p.name}:\n{p.log_tail(20)}" for p in list(self.agents.values())[:3]]
        return "\n".join(parts)
