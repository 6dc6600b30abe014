"""One import name per module: ``gpuhealth.common``, never a second copy under ``common``; the
development tooling (``localkube``, ``demo``, ``bench``) importable from any directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("name", ["agent", "controller", "common", "protocol"])
def test_a_bare_name_is_refused_even_with_the_repository_on_the_path(name: str) -> None:
    # `python -c` in the repository root puts the root first on sys.path: the bare package
    # is found, and refuses to load (a second copy of every module beside gpuhealth.<name>).
    done = _run(f"import {name}", ROOT)
    assert done.returncode != 0
    assert f"ImportError: import gpuhealth.{name}, not {name}" in done.stderr


def test_the_installed_names_import(tmp_path: Path) -> None:
    done = _run("import gpuhealth.agent, gpuhealth.controller, gpuhealth.common", tmp_path)
    assert done.returncode == 0, done.stderr


def test_the_dev_tooling_imports_from_any_directory_and_the_product_does_not(
    tmp_path: Path,
) -> None:
    # `make venv` puts hack/pythonpath/ (links to localkube, demo, bench only) on the path.
    done = _run("import localkube, demo, bench.report", tmp_path)
    assert done.returncode == 0, f"{done.stderr}\n(run `make venv` to add the .pth file)"
    done = _run("import common", tmp_path)
    assert "ModuleNotFoundError" in done.stderr
