"""The real-node suite (``make e2e``): a real containerd + kubelet node from localkube.

Needs root, the node's binaries (``hack/kube-binaries.sh --node``), the Debian packages of
``hack/system-deps.sh`` and, for the chart, the image archive of ``make image``
(``GPUHEALTH_IMAGE_ARCHIVE``). Missing pieces skip the suite on a developer's machine and
fail it under ``CI=true`` (tests/integration/tooling.py).

Only one real node runs on a host at a time (the kubelet's directory is host-wide): each
test module starts and stops its own.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from localkube.assets import AssetsMissing, assets_dir, binary
from localkube.node import preflight
from tests.integration.tooling import missing

NODE_BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-scheduler",
    "kube-controller-manager",
    "kubelet",
    "kube-proxy",
    "coredns",
    "helm",
)


@pytest.fixture(scope="session")
def node_assets() -> Path:
    """The binaries' directory, with everything a real node needs; the host can run one."""
    try:
        preflight()
        directory = assets_dir(node=True)
        for name in NODE_BINARIES:
            binary(directory, name)
    except AssetsMissing as exc:
        missing(f"the real node cannot run here: {exc}")
    return directory


@pytest.fixture(scope="session")
def image_archive() -> Path:
    value = os.environ.get("GPUHEALTH_IMAGE_ARCHIVE", "")
    path = (
        Path(value)
        if value
        else Path(__file__).resolve().parents[2] / "dist" / "gpuhealth-image.tar"
    )
    if not path.is_file():
        missing(f"the image archive {path} does not exist (make image)")
    return path


@pytest.fixture(scope="session")
def log() -> Callable[[str], None]:
    def write(message: str) -> None:
        print(f"[node] {message}", file=sys.stderr, flush=True)

    return write
