"""The remediation episode the demo plays: the GPURemediation CRD, the episodes as the API
server shows them, their phase changes as event lines and the phase times at the end.

The double-bit ECC node's GPU is not reset by the scenario: the controller's loop
(quarantine → drain → reset over the agent stream → validation soak → Returned) does it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from gpuhealth.controller.kube.rest import ConflictError, KubeError, request
from gpuhealth.controller.remediation.model import GROUP, PLURAL, VERSION
from localkube.objects import wait_for

REPO_ROOT = Path(__file__).resolve().parent.parent
CRDS = REPO_ROOT / "deploy/helm/gpuhealth/files/crds"
CRD_FILES = (CRDS / "gpuremediations.gpuhealth.io.yaml", CRDS / "gpuincidents.gpuhealth.io.yaml")
"""The chart's CRDs: the remediation episodes, and the incidents the controller keeps as
objects."""
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
EPISODES_PATH = f"/apis/{GROUP}/{VERSION}/{PLURAL}"
STAGES = ("detected", "quarantined", "drained", "remediated", "validated", "returned")
REQUEST_TIMEOUT_S = 10.0


async def install_crd(api: Any) -> None:
    """The chart's CRDs (kept if they exist), served before the controller starts."""
    for crd_file in CRD_FILES:
        body = yaml.safe_load(crd_file.read_text())
        with contextlib.suppress(ConflictError):
            await request(api, "POST", CRD_PATH, body=body, timeout_s=REQUEST_TIMEOUT_S)
        name = body["metadata"]["name"]
        spec = body["spec"]
        objects = f"/apis/{spec['group']}/{spec['versions'][0]['name']}/{spec['names']['plural']}"

        async def established(name: str = name, objects: str = objects) -> bool:
            crd = await request(api, "GET", f"{CRD_PATH}/{name}", timeout_s=REQUEST_TIMEOUT_S)
            conds = (crd.get("status") or {}).get("conditions") or []
            if not any(c.get("type") == "Established" and c.get("status") == "True" for c in conds):
                return False
            try:  # a new CRD's storage answers 429 for a moment after Established
                await request(api, "GET", objects, timeout_s=REQUEST_TIMEOUT_S)
            except KubeError:
                return False
            return True

        await wait_for(established, what=f"the {name} CRD served", timeout_s=30)


async def episodes(api: Any) -> list[dict[str, Any]]:
    doc = await request(api, "GET", EPISODES_PATH, timeout_s=REQUEST_TIMEOUT_S)
    return list(doc.get("items") or [])


def phase_changes(seen: dict[str, str], items: Sequence[Mapping[str, Any]]) -> list[str]:
    """Event lines for episodes that are new or changed phase since ``seen`` (updated)."""
    lines = []
    for ep in items:
        name = str(ep.get("metadata", {}).get("name", "?"))
        status = ep.get("status") or {}
        phase = str(status.get("phase") or "")
        returned = bool((status.get("times") or {}).get("returned"))
        key = f"{phase}+" if returned else phase
        if not phase or seen.get(name) == key:
            continue
        seen[name] = key
        spec = ep.get("spec") or {}
        what = "quarantine lifted" if returned else str(status.get("reason") or "")
        lines.append(
            f"{spec.get('nodeName', '?')} remediation {phase}"
            f" ({spec.get('action', '?')}{': ' + what if what else ''})"
        )
    return lines


def _at(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def stage_times(ep: Mapping[str, Any]) -> list[tuple[str, float]]:
    """(stage, seconds after detection) for every stage the episode reached."""
    times = (ep.get("status") or {}).get("times") or {}
    start = _at(times.get("detected"))
    if start is None:
        return []
    out = []
    for stage in STAGES:
        at = _at(times.get(stage))
        if at is not None:
            out.append((stage, (at - start).total_seconds()))
    return out


def timeline_lines(items: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per episode: its phase and when it reached each stage."""
    lines = []
    for ep in items:
        spec = ep.get("spec") or {}
        status = ep.get("status") or {}
        stages = " → ".join(f"{s} +{t:.1f}s" for s, t in stage_times(ep))
        lines.append(
            f"{spec.get('nodeName', '?')} ({spec.get('action', '?')}): "
            f"{status.get('phase', '?')}; {stages or 'no stage times'}"
        )
    return lines


def returned_nodes(items: Sequence[Mapping[str, Any]]) -> set[str]:
    """Nodes with an episode that went through every stage to Returned."""
    return {
        str((ep.get("spec") or {}).get("nodeName"))
        for ep in items
        if (ep.get("status") or {}).get("phase") == "Returned"
        and [s for s, _ in stage_times(ep)] == list(STAGES)
    }
