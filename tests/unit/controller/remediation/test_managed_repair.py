"""One owner per repair (``remediation/managed_repair.py``, pure, table-driven): which managed
repairer owns a node, from its labels and the conditions the node cache kept; the rules'
defaults for EKS, AKS and GKE; the node cache keeps only the conditions and statuses the rules
watch."""

from __future__ import annotations

import msgspec
import pytest

from gpuhealth.common.config import SettingError
from gpuhealth.controller.kube.node_view import node_view
from gpuhealth.controller.remediation.managed_repair import repair_owner
from gpuhealth.controller.remediation.settings import ManagedRepairRule, ManagedRepairSettings

DEFAULTS = ManagedRepairSettings()
AKS = {"kubernetes.azure.com/agentpool": "gpu"}
GKE = {"cloud.google.com/gke-nodepool": "gpu"}


@pytest.mark.parametrize(
    ("labels", "conditions", "owner", "signal"),
    [
        ({}, (), None, None),
        (
            {},
            (("AcceleratedHardwareReady", "False"),),
            "eks-node-auto-repair",
            "AcceleratedHardwareReady=False",
        ),
        ({}, (("KernelReady", "False"),), "eks-node-auto-repair", "KernelReady=False"),
        ({}, (("AcceleratedHardwareReady", "True"),), None, None),
        ({}, (("Ready", "False"),), None, None),  # not Ready, on no managed cloud
        (AKS, (("Ready", "Unknown"),), "aks-node-auto-repair", "Ready=Unknown"),
        (GKE, (("Ready", "False"),), "gke-node-auto-repair", "Ready=False"),
        (GKE, (("Ready", "True"),), None, None),
    ],
)
def test_the_default_rules(
    labels: dict[str, str],
    conditions: tuple[tuple[str, str], ...],
    owner: str | None,
    signal: str | None,
) -> None:
    got = repair_owner(labels, conditions, DEFAULTS)
    assert (got.owner if got else None, got.signal if got else None) == (owner, signal)


def test_a_label_rule_and_a_value_and_the_switch() -> None:
    rules = ManagedRepairSettings(
        rules=(
            ManagedRepairRule(owner="vendor", label="repair.example.com/owner", label_value="v"),
        )
    )
    assert repair_owner({"repair.example.com/owner": "w"}, (), rules) is None
    got = repair_owner({"repair.example.com/owner": "v"}, (), rules)
    assert got is not None and got.owner == "vendor"
    off = ManagedRepairSettings(enabled=False)
    assert repair_owner({}, (("AcceleratedHardwareReady", "False"),), off) is None
    assert off.watched() == {}


def test_a_rule_needs_a_condition_or_a_label() -> None:
    with pytest.raises(SettingError):
        ManagedRepairRule(owner="x").check()
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert(
            {"rules": [{"owner": "x", "condition": "C", "statuses": ["Maybe"]}]},
            ManagedRepairSettings,
        )


def test_the_node_cache_keeps_only_the_watched_conditions_in_watched_statuses() -> None:
    obj = {
        "metadata": {"name": "n", "resourceVersion": "1"},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "AcceleratedHardwareReady", "status": "False"},
                {"type": "KernelReady", "status": "True"},
                {"type": "MemoryPressure", "status": "False"},
            ]
        },
    }
    view = node_view(obj, watched=DEFAULTS.watched())
    assert view.conditions == (("AcceleratedHardwareReady", "False"),)
    assert node_view(obj).conditions == ()
    healthy = node_view(
        {
            "metadata": {"name": "n"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        },
        watched=DEFAULTS.watched(),
    )
    assert healthy.conditions == ()
