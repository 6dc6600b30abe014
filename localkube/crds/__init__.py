"""Other projects' CRDs the tests and the demo install on the local API server.

``karpenter/``: Karpenter's NodeClaim and NodePool (``karpenter.sh/v1``), reduced to their
structure (each file names the published CRD it follows). No Karpenter controller runs: the
tests and the demo's stand-in create NodeClaims and assert what gpuhealth reads and deletes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

KARPENTER = Path(__file__).resolve().parent / "karpenter"
KARPENTER_CRDS = ("nodeclaims.karpenter.sh", "nodepools.karpenter.sh")
"""The CRDs' names (each file is ``<name>.yaml``)."""


def karpenter_crds() -> list[dict[str, Any]]:
    """The CRD objects, ready to create."""
    return [yaml.safe_load((KARPENTER / f"{name}.yaml").read_text()) for name in KARPENTER_CRDS]
