"""Image archives for the real node: the pause image, and the names archives carry."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path

from localkube.assets import REPO_ROOT, AssetsMissing

PAUSE_SCRIPT = REPO_ROOT / "hack" / "image" / "pause.sh"
PAUSE_ENV = "GPUHEALTH_PAUSE_IMAGE"
CONTAINERD_NAME = "io.containerd.image.name"
OCI_REF_NAME = "org.opencontainers.image.ref.name"


def pause_image() -> Path:
    """The pause image's OCI archive: ``$GPUHEALTH_PAUSE_IMAGE``, or built (once, cached) by
    ``hack/image/pause.sh``."""
    value = os.environ.get(PAUSE_ENV)
    if value:
        return Path(value)
    result = subprocess.run(
        ["bash", str(PAUSE_SCRIPT)], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise AssetsMissing(
            f"{PAUSE_SCRIPT} failed (exit {result.returncode}): {result.stderr.strip()[-2000:]}"
        )
    return Path(result.stdout.strip().splitlines()[-1])


def archive_image_names(archive: Path) -> list[str]:
    """The image names an OCI archive's index gives (containerd's annotation first)."""
    try:
        with tarfile.open(archive) as tar:
            member = tar.extractfile("index.json")
            if member is None:
                raise AssetsMissing(f"{archive} has no index.json (not an OCI archive)")
            index = json.load(member)
    except (OSError, tarfile.TarError, KeyError, json.JSONDecodeError) as exc:
        raise AssetsMissing(f"cannot read the OCI archive {archive}: {exc}") from exc
    names = []
    for manifest in index.get("manifests", []):
        notes = manifest.get("annotations") or {}
        name = notes.get(CONTAINERD_NAME) or notes.get(OCI_REF_NAME)
        if name:
            names.append(name)
    return names
