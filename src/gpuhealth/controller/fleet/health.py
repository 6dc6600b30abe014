"""What the fleet knows of a node's health, as the policy reads it (``Fleet.node_health``,
:func:`gpuhealth.controller.taints.policy.desired_node`): whether its agent reports, and its
GPUs' states and conditions."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from gpuhealth.protocol import Condition, MigDeviceInfo, NicPortInfo, worst_state
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

RAIL_SCOPE = "rail"
"""The impact scope of a ``rail-*`` condition: the fault is the network port's beside the GPU
(``Snapshot.nics``), not the GPU's. Never the primary fault of a remediation episode (no reset
or reboot of a GPU fixes a link: :func:`gpuhealth.controller.remediation.fault.failed_gpus`);
it spares the GPUs behind the port the blame for the job crashes it causes
(:mod:`gpuhealth.controller.incidents.network_blame`)."""


def is_rail(c: Condition) -> bool:
    """A condition about the network port beside the GPU, not the GPU itself."""
    return c.scope == RAIL_SCOPE


def own_state(state: HealthState, conditions: Iterable[Condition]) -> HealthState:
    """The GPU's state by its own conditions, its rail's left out: what the remediation loop
    judges a GPU by (a flapping link beside it neither fails it nor keeps it from passing its
    validation). ``unknown`` stays."""
    conditions = tuple(conditions)
    if state == "unknown" or not any(is_rail(c) for c in conditions):
        return state
    return worst_state(c.severity for c in conditions if not is_rail(c))


def port_name(nic: NicPortInfo) -> str:
    """``mlx5_0/1``: an RDMA device and its port, as the API, the page and incidents name it."""
    return f"{nic.device}/{nic.port}"


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
