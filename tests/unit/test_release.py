"""What a release publishes and what the chart installs by default are the same image: the
version in pyproject.toml, Chart.yaml (version and appVersion) and the Containerfile agree,
and the chart's default repository is the one `make image` names and the release workflow
pushes to."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpuhealth"


def _version() -> str:
    with (ROOT / "pyproject.toml").open("rb") as f:
        version: str = tomllib.load(f)["project"]["version"]
    return version


def test_chart_and_containerfile_carry_the_package_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert str(chart["version"]) == _version()
    assert str(chart["appVersion"]) == _version()
    containerfile = (ROOT / "Containerfile").read_text()
    assert f"ARG VERSION={_version()}" in containerfile


def test_default_image_is_what_a_release_publishes() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    # Empty tag: the chart's appVersion, i.e. the released version.
    assert values["image"]["tag"] == ""
    repository = values["image"]["repository"]
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "release.yml").read_text())
    assert workflow["env"]["IMAGE"] == repository
    build = (ROOT / "hack" / "image" / "build.sh").read_text()
    assert f'IMAGE_REPO="${{IMAGE_REPO:-{repository}}}"' in build
    assert 'IMAGE_TAG="${IMAGE_TAG:-$VERSION}"' in build


def test_release_workflow_pushes_the_image_and_the_chart_on_version_tags() -> None:
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "release.yml").read_text())
    # PyYAML reads the key "on" as True.
    trigger = workflow.get("on", workflow.get(True))
    assert trigger == {"push": {"tags": ["v*.*.*"]}}
    steps = workflow["jobs"]["release"]["steps"]
    build = next(s for s in steps if s.get("uses", "").startswith("docker/build-push-action"))
    assert build["with"]["file"] == "Containerfile"
    assert build["with"]["push"] is True
    assert build["with"]["tags"] == "${{ env.IMAGE }}:${{ steps.version.outputs.version }}"
    scripts = "\n".join(s.get("run", "") for s in steps)
    assert re.search(r"helm push .*\$CHARTS", scripts)
    assert workflow["jobs"]["release"]["permissions"] == {"contents": "read", "packages": "write"}


def test_image_dependencies_are_locked_with_hashes() -> None:
    lock = (ROOT / "hack" / "image" / "requirements.lock").read_text().splitlines()
    pins = [line for line in lock if line and not line.startswith("#")]
    assert pins
    for line in pins:
        assert re.fullmatch(r"[a-z0-9-]+==[^ ]+ --hash=sha256:[0-9a-f]{64}", line), line
    locked = {line.split("==")[0]: line.split("==")[1].split()[0] for line in pins}
    with (ROOT / "pyproject.toml").open("rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    for dep in map(Requirement, deps):
        name = canonicalize_name(dep.name)
        assert name in locked, f"{name} is a dependency but not in requirements.lock"
        assert dep.specifier.contains(locked[name]), f"{name}=={locked[name]} is not {dep}"
