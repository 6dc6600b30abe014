"""The wheel installs everything under the distribution's own name, ``gpuhealth``.

The repository keeps ``agent/``, ``controller/``, ``protocol/`` and ``common/`` at the top
level; ``gpuhealth/`` links to them. A wheel that installed a top-level ``agent`` or
``controller`` package would collide with any other package of that name.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(out), str(REPO)],
        check=True,
        capture_output=True,
        cwd=out,
    )  # fmt: skip
    (path,) = out.glob("gpuhealth-*.whl")
    return zipfile.ZipFile(path)


def test_every_module_is_under_gpuhealth(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    tops = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert tops == {"gpuhealth"}
    packages = {n.split("/")[1] for n in names if n.startswith("gpuhealth/") and n.count("/") > 1}
    assert packages == {"agent", "controller", "common", "protocol"}


def test_data_files_and_entry_points_ship(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    for data in (
        "gpuhealth/agent/health/xid_catalog.yaml",
        "gpuhealth/controller/status_page/static/index.html",
        "gpuhealth/agent/podresources/_pb/api_pb2.py",
        "gpuhealth/agent/py.typed",
    ):
        assert data in names, data
    (ep,) = [n for n in names if n.endswith("entry_points.txt")]
    text = wheel.read(ep).decode()
    assert "gpuhealth-agent = gpuhealth.agent.cli:main" in text
    assert "gpuhealth-controller = gpuhealth.controller.cli:main" in text
