"""The wheel installs everything under the distribution's own name, ``gpuhealth``.

The repository keeps ``agent/``, ``controller/``, ``protocol/`` and ``common/`` at the top
level; ``gpuhealth/`` links to them. A wheel that installed a top-level ``agent`` or
``controller`` package would collide with any other package of that name.

The wheel is built from a copy of the files git tracks (what a release builds from): a stale
``build/`` or ``*.egg-info`` directory, or an untracked file, in the checkout cannot make the
test pass or fail.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.integration.tooling import missing, require

REPO = Path(__file__).resolve().parents[2]


def tracked_copy(dest: Path) -> Path:
    """The files git tracks in REPO (as they are in the work tree, symbolic links kept),
    copied to ``dest``."""
    git = require("git", hint="the wheel is built from the files git tracks")
    listed = subprocess.run(
        [git, "-C", str(REPO), "ls-files", "-z", "--cached"],
        capture_output=True,
        check=False,
    )
    if listed.returncode != 0:
        missing(f"{REPO} is not a git checkout: {listed.stderr.decode().strip()}")
    for name in filter(None, listed.stdout.decode().split("\0")):
        src, dst = REPO / name, dest / name
        if not src.is_symlink() and not src.exists():
            continue  # deleted in the work tree, not yet in the index
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst, follow_symlinks=False)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    src = tracked_copy(tmp_path_factory.mktemp("src"))
    assert not (src / "build").exists()
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(out), str(src)],
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
