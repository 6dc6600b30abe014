"""One owner per repair (pure): does a managed repairer own this node's repair?

EKS node auto repair (with the EKS node monitoring agent's Node conditions, or Karpenter's node
repair), AKS node auto-repair and GKE node auto-repair each repair a node they judge broken:
they reboot, reimage, replace it. Two repairers on one node fight (a reset under a reimage, a
drain under a replacement), so where one of ``remediation.managed_repair.rules`` matches the
Node, gpuhealth decides and taints, records who owns the repair, and the managed service
repairs: no disruptive step of gpuhealth's, no replacement, no autoscaler annotation in its way
(docs/remediation.md "Managed repair"). gpuhealth only reads these signs; it never writes or
removes a condition, label or taint it did not write.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpuhealth.controller.remediation.settings import ManagedRepairSettings


@dataclass(frozen=True, slots=True)
class RepairOwner:
    owner: str
    signal: str
    """What on the Node said so: ``AcceleratedHardwareReady=False``, ``label k=v``."""


def repair_owner(
    labels: Mapping[str, str],
    conditions: Iterable[tuple[str, str]],
    settings: ManagedRepairSettings,
) -> RepairOwner | None:
    """The first rule the node matches (its labels, and the (type, status) of the conditions
    the node cache kept for the rules), or None."""
    if not settings.enabled:
        return None
    status = dict(conditions)
    for rule in settings.rules:
        if rule.label is not None:
            value = labels.get(rule.label)
            if value is None or (rule.label_value is not None and value != rule.label_value):
                continue
        if rule.condition:
            have = status.get(rule.condition)
            if have is None or have not in rule.statuses:
                continue
            return RepairOwner(rule.owner, f"{rule.condition}={have}")
        return RepairOwner(rule.owner, f"label {rule.label}={labels.get(rule.label or '', '')}")
    return None
