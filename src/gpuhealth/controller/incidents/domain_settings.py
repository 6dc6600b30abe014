"""The ``domains:`` section of the controller configuration: NVLink domain incidents
(controller/incidents/domains.py, docs/operations.md "NVLink domain incidents")."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from gpuhealth.common.config import PositiveInt, PositiveSeconds, Settings

XidCode = Annotated[int, Meta(ge=1, le=1023)]


class DomainSettings(Settings, frozen=True, kw_only=True):
    """Multi-node NVLink domains (GB200/GB300 NVL72 racks): one incident for a shared fabric."""

    enabled: bool = True
    """Group nodes into NVLink domains and open one domain incident when fabric or NVLink
    faults appear on several of a domain's nodes. Off: every node is judged alone."""
    min_nodes: PositiveInt = 2
    """Faulty nodes of one domain (their faults first seen within ``window_s``) that make a
    domain incident."""
    window_s: PositiveSeconds = 300.0
    """The window in which the faults of ``min_nodes`` nodes must first appear (a burst)."""
    accrual_s: PositiveSeconds = 900.0
    """Faults still current accrue: a node's fault first seen within this of the previous
    one's (while that one persists) joins it, so trays faulting 6 minutes apart count
    together. Not longer than ``window_s``: the burst alone."""
    clique_label: str = "nvidia.com/gpu.clique"
    """The node label naming a node's domain (GPU feature discovery: ``<clusterUUID>.<cliqueId>``);
    used when the node's agent does not report its GPUs' fabric membership, and over the
    agent's claim where the two disagree (a Warning Event ``NvlinkDomainMismatch`` and the
    gauge ``gpuhealth_nvlink_domain_mismatch_nodes``)."""
    topology_labels: list[str] = msgspec.field(default_factory=list)
    """Node labels that name a node's rack (``topology.kubernetes.io/rack``, a cloud's
    network-block label ...), first present wins: a node whose agent reports no fabric
    membership (fabric not ready: no clique yet) and that has no clique label is grouped by its
    value, so a rack-wide fabric registration failure is one domain incident. Empty: such
    nodes are in no domain."""
    taint_effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"
    """The effect of the domain taint (``<prefix>/nvlink-domain=<domain>``) every node of a
    domain with an open incident gets; only work that tolerates it (or does not need the
    fabric, by a toleration its owner adds) still lands there."""
    fault_xids: frozenset[XidCode] = msgspec.field(
        default_factory=lambda: frozenset({74, 144, 145, 146, 147, 148, 149, 150})
    )
    """XIDs that count as NVLink faults of a node (74: NVLink error; 144-150: NVLink5)."""
    fault_codes: frozenset[str] = msgspec.field(
        default_factory=lambda: frozenset({"fabric-not-ready", "fabric-degraded", "nvswitch-fatal"})
    )
    """Agent condition codes (GPU or node) that count as fabric faults of a node."""
    evaluate_interval_s: PositiveSeconds = 5.0
    """How often the domains with an open incident are judged again (besides each change):
    incidents close, the breaker's reset admits a held domain."""
