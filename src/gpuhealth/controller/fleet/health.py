"""What the fleet knows of a node's health, as the policy reads it (``Fleet.node_health``,
:func:`gpuhealth.controller.taints.policy.desired_node`): whether its agent reports, and its
GPUs' states and conditions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpuhealth.protocol import Condition, MigDeviceInfo
from gpuhealth.protocol.v1 import HealthState

Reporting = Literal["ok", "no-data", "silent", "missing"]
"""``ok``: a Snapshot arrived and the agent speaks; ``no-data``: no Snapshot since this
controller started; ``silent``: the agent stopped reporting; ``missing``: a GPU node with no
Snapshot after the grace of ``incidents.unwatched`` (no agent watches it)."""

GPU_MISSING_CODE = "gpu-missing"
"""A GPU the node should have is gone from the bus (the agent's node condition, or fewer GPUs
reported than its Hello's ``expected_gpus``): the node is unhealthy like a broken GPU."""

NVLINK_DOMAIN_SCOPE = "nvlink-domain"
"""The impact scope (``Condition.scope``) of a fault of the shared NVLink fabric: the
incidents' domain monitor counts it, the remediation loop escalates it (no reset of one node
fixes it)."""


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """What the agent last reported for one GPU, as the policy reads it."""

    index: int
    uuid: str
    state: HealthState
    conditions: tuple[Condition, ...] = ()
    mig_devices: tuple[MigDeviceInfo, ...] = ()
    """The GPU's MIG devices as its agent reported them (``GpuInfo.mig_devices``)."""


@dataclass(frozen=True, slots=True)
class NodeHealth:
    """The policy's input for one node: whether its agent reports, and its GPUs by index."""

    name: str
    reporting: Reporting
    gpus: tuple[GpuHealth, ...] = ()
    gpus_missing: int = 0
    """GPUs the node should have that its agent cannot see (each counts as unhealthy)."""
    node_conditions: tuple[Condition, ...] = ()
    """The agent's verdicts about the node itself (their text explains ``gpus_missing``)."""
