"""One package tree under one name: ``src/gpuhealth/`` holds the product as real folders, so the
import path is the file path; the development tooling (``localkube``, ``demo``, ``bench``) stays
outside it and imports from any directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "gpuhealth"
PACKAGES = ("agent", "controller", "common", "protocol")


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_product_is_real_folders_without_links() -> None:
    links = [p.relative_to(ROOT).as_posix() for p in SRC.rglob("*") if p.is_symlink()]
    assert links == []
    for name in PACKAGES:
        assert (SRC / name / "__init__.py").is_file()
        assert not (ROOT / name).exists(), f"{name}/ at the repository root: a second tree"
    assert not (ROOT / "gpuhealth").exists()


@pytest.mark.parametrize("name", PACKAGES)
def test_a_bare_name_does_not_import_even_from_the_repository_root(name: str) -> None:
    done = _run(f"import {name}", ROOT)
    assert done.returncode != 0
    assert "ModuleNotFoundError" in done.stderr


def test_the_installed_names_import_from_the_source_tree(tmp_path: Path) -> None:
    done = _run(
        "import gpuhealth.agent, gpuhealth.controller, gpuhealth.common, gpuhealth.protocol\n"
        "print(gpuhealth.agent.__file__)",
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()) == SRC / "agent" / "__init__.py"


def test_the_dev_tooling_imports_from_any_directory(tmp_path: Path) -> None:
    # `make venv` puts the repository root (where the product is not) on the path.
    done = _run("import localkube, demo, bench.report", tmp_path)
    assert done.returncode == 0, f"{done.stderr}\n(run `make venv` to add the .pth file)"
