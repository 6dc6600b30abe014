"""The helm CLI against a local cluster, with its cache, config and data kept in a work
directory (nothing written under the user's home)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from localkube.process import LocalKubeError

DEFAULT_TIMEOUT = "3m"
"""``--timeout`` of install/upgrade --wait and uninstall --wait."""
PROCESS_MARGIN_S = 60.0
"""The helm process itself gets this much longer than its own --timeout."""


class Helm:
    def __init__(self, binary: Path, kubeconfig: Path, workdir: Path) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self._values = 0
        self.env = {
            **os.environ,
            "HELM_CACHE_HOME": str(workdir / "cache"),
            "HELM_CONFIG_HOME": str(workdir / "config"),
            "HELM_DATA_HOME": str(workdir / "data"),
            "KUBECONFIG": str(kubeconfig),
        }

    def run(self, *args: str, timeout_s: float = 360.0) -> str:
        """stdout of ``helm ARGS``; :class:`LocalKubeError` with stderr when it fails."""
        argv = [str(self.binary), *args]
        try:
            result = subprocess.run(
                argv, capture_output=True, text=True, env=self.env, timeout=timeout_s, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise LocalKubeError(f"helm {' '.join(args)} timed out after {timeout_s:.0f}s") from exc
        if result.returncode != 0:
            raise LocalKubeError(f"helm {' '.join(args)} failed: {result.stderr.strip()[-3000:]}")
        return result.stdout

    def _values_file(self, values: dict[str, Any]) -> Path:
        self._values += 1
        path = self.workdir / f"values-{self._values}.yaml"
        path.write_text(yaml.safe_dump(values, sort_keys=False))
        return path

    def install(
        self,
        release: str,
        chart: Path,
        namespace: str,
        values: dict[str, Any],
        *,
        timeout: str = DEFAULT_TIMEOUT,
    ) -> str:
        """``helm install --wait``: returns once every Deployment and DaemonSet is ready."""
        return self.run(
            "install", release, str(chart), "--namespace", namespace, "--create-namespace",
            "--values", str(self._values_file(values)), "--wait", "--timeout", timeout,
        )  # fmt: skip

    def upgrade(
        self,
        release: str,
        chart: Path,
        namespace: str,
        values: dict[str, Any],
        *,
        timeout: str = DEFAULT_TIMEOUT,
    ) -> str:
        return self.run(
            "upgrade", release, str(chart), "--namespace", namespace,
            "--values", str(self._values_file(values)), "--wait", "--timeout", timeout,
        )  # fmt: skip

    def uninstall(self, release: str, namespace: str, *, timeout: str = DEFAULT_TIMEOUT) -> str:
        """``helm uninstall --wait``: returns once the release's objects are gone."""
        return self.run(
            "uninstall", release, "--namespace", namespace, "--wait", "--timeout", timeout
        )

    def history(self, release: str, namespace: str) -> list[dict[str, Any]]:
        out = self.run("history", release, "--namespace", namespace, "--output", "yaml")
        history: list[dict[str, Any]] = yaml.safe_load(out) or []
        return history
