"""Where the Kubernetes binaries are: GPUHEALTH_ASSETS, KUBEBUILDER_ASSETS, or hack/ builds them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from localkube.process import LocalKubeError

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO_ROOT / "hack" / "kube-binaries.sh"
ENV_VARS = ("GPUHEALTH_ASSETS", "KUBEBUILDER_ASSETS")


class AssetsMissing(LocalKubeError):
    """A binary the control plane needs is not available on this machine."""


def assets_dir(*, build: bool = True, node: bool = False) -> Path:
    """The directory holding the binaries.

    The environment wins (GPUHEALTH_ASSETS, then KUBEBUILDER_ASSETS); otherwise, when
    ``build`` is true, ``hack/kube-binaries.sh`` prints (and on first use builds) it — with
    ``node``, also the real node's binaries (kubelet, kube-proxy, kube-controller-manager,
    coredns).
    """
    for var in ENV_VARS:
        value = os.environ.get(var)
        if value:
            return Path(value)
    if not build:
        raise AssetsMissing(f"none of {', '.join(ENV_VARS)} is set")
    if not BUILD_SCRIPT.is_file():
        raise AssetsMissing(f"none of {', '.join(ENV_VARS)} is set and {BUILD_SCRIPT} is absent")
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT), *(["--node"] if node else [])],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise AssetsMissing(
            f"{BUILD_SCRIPT} failed (exit {result.returncode}): {result.stderr.strip()[-2000:]}"
        )
    return Path(result.stdout.strip().splitlines()[-1])


def binary(directory: Path, name: str) -> Path:
    """``directory/name`` if it is an executable file, else :class:`AssetsMissing`."""
    path = directory / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise AssetsMissing(f"{name} not found in {directory}")
    return path
