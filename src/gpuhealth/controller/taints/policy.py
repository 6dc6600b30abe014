"""Pure policy: from a node's GPU health and the settings to its desired Kubernetes facts.

No I/O here. :func:`desired_node` returns the taints gpuhealth wants on a node, its
labels, the ``GPUHealthy`` condition and the devices that deserve a DRA DeviceTaintRule.
Whether a write is allowed (circuit breaker, operator acknowledgements) is decided later, in
:mod:`gpuhealth.controller.taints.plan`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gpuhealth.controller.fleet.health import GPU_MISSING_CODE, GpuHealth, NodeHealth
from gpuhealth.controller.kube.node_view import NodeCondition
from gpuhealth.controller.names import (
    REASON_AGENT_MISSING,
    REASON_AGENT_NOT_REPORTING,
    REASON_ALL_GPUS_HEALTHY,
    REASON_GPU_DEGRADED,
    REASON_GPU_MISSING,
    REASON_GPU_UNHEALTHY,
    Keys,
)
from gpuhealth.controller.taints.mig_scope import instance_devices
from gpuhealth.controller.taints.settings import CordonMode, PolicySettings
from gpuhealth.protocol import Condition, worst_state

HARD_EFFECTS: frozenset[str] = frozenset({"NoSchedule", "NoExecute"})

MAX_CONDITION_MESSAGE = 1024
AGENT_SILENT_CODE = "agent-silent"
AGENT_MISSING_CODE = "agent-missing"


@dataclass(frozen=True, slots=True, order=True)
class Taint:
    key: str
    value: str
    effect: str

    @property
    def hard(self) -> bool:
        return self.effect in HARD_EFFECTS

    def render(self) -> str:
        return f"{self.key}={self.value}:{self.effect}"

    def to_api(self) -> dict[str, str]:
        return {"key": self.key, "value": self.value, "effect": self.effect}


@dataclass(frozen=True, slots=True)
class DeviceVerdict:
    """An unhealthy GPU whose DRA devices should carry a device taint
    (:mod:`gpuhealth.controller.taints.mig_scope` decides which of its MIG devices)."""

    uuid: str
    index: int
    code: str
    mig_uuids: tuple[str, ...] = ()
    """Every MIG device of the GPU its agent reported: found in the ResourceSlices by their
    own ``uuid`` when the slices do not name the parent GPU."""
    instances: tuple[str, ...] = ()
    """Non-empty: the fault is confined to these MIG devices, only they are tainted.
    Empty: GPU-wide, the GPU's own device and every MIG device carved from it."""


@dataclass(frozen=True, slots=True)
class Hold:
    """What the remediation loop holds on a node (``gpuhealth.controller.remediation.taint``):
    its quarantine taint, whether the autoscalers must keep their hands off it, and whether
    it must be cordoned whatever ``policy.cordon`` says."""

    taint: Taint | None
    guard: bool | None = True
    """The autoscalers' annotations (``policy.disruption_guard``): False when a managed
    repairer owns the node (gpuhealth does not stand in its way); None: leave them as they
    are (the episodes are not known yet)."""
    cordon: bool | None = False
    """Cordoned for its replacement's drain; None: leave the cordon as it is."""


KEEP = Hold(None, guard=None, cordon=None)
"""Before the episodes are known: nothing of the remediation loop's is added or lifted."""


@dataclass(frozen=True, slots=True)
class DesiredNode:
    taints: frozenset[Taint]
    authoritative: bool
    """False (no data yet, agent silent): never remove a taint of ours, only add."""
    manage_meta: bool
    """Write labels and the GPUHealthy condition (False: excluded, or no data yet)."""
    labels: tuple[tuple[str, str], ...] = ()
    condition: NodeCondition | None = None
    devices: tuple[DeviceVerdict, ...] = ()
    state: str = "unknown"
    governed: frozenset[str] = frozenset()
    """Taint keys of ours this state decides even when not ``authoritative`` (the NVLink
    domain taint: the domain's incident, not the node's own health, decides it)."""
    guard: bool | None = False
    """Set the autoscalers' annotations (``karpenter.sh/do-not-disrupt``,
    ``cluster-autoscaler.kubernetes.io/scale-down-disabled``): gpuhealth holds the node; None:
    leave what gpuhealth set as it is."""
    cordon: CordonMode = "never"
    """When the taints cordon the node (``policy.cordon``)."""
    cordon_always: bool | None = False
    """Cordoned whatever the taints (an escalated node drained for its replacement); None:
    leave the cordon gpuhealth set as it is."""


def _age_key(c: Condition) -> tuple[float, str]:
    return (c.since.timestamp() if c.since is not None else float("inf"), c.code)


def primary_condition(gpu: GpuHealth) -> Condition | None:
    """The condition that explains the GPU's state: the oldest one at that severity.

    Oldest, not first on the wire: a GPU that logs XID 79 and is then lost keeps its
    ``xid-79`` taint value instead of flapping to ``gpu-lost`` (a needless write and Event).
    """
    at_state = [c for c in gpu.conditions if c.severity == gpu.state]
    if at_state:
        return min(at_state, key=_age_key)
    return gpu.conditions[0] if gpu.conditions else None


def gpu_code(gpu: GpuHealth) -> str:
    c = primary_condition(gpu)
    return c.code if c is not None and c.code else f"gpu-{gpu.state}"


def device_verdict(gpu: GpuHealth) -> DeviceVerdict:
    """What an unhealthy GPU's DeviceTaintRules cover (GPU-wide, or its MIG instances)."""
    return DeviceVerdict(
        gpu.uuid,
        gpu.index,
        gpu_code(gpu),
        mig_uuids=tuple(m.uuid for m in gpu.mig_devices),
        instances=instance_devices(gpu.conditions, gpu.mig_devices),
    )


def _clip(msg: str) -> str:
    return msg if len(msg) <= MAX_CONDITION_MESSAGE else msg[: MAX_CONDITION_MESSAGE - 3] + "..."


def _describe(gpus: list[GpuHealth]) -> str:
    parts = []
    for g in gpus:
        c = primary_condition(g)
        why = f"{c.reason} {c.code}" + (f" ({c.message})" if c.message else "") if c else g.state
        parts.append(f"GPU {g.index} ({g.uuid}): {why}")
    return _clip("; ".join(parts))


def _describe_missing(report: NodeHealth) -> str:
    said = next((c.message for c in report.node_conditions if c.code == GPU_MISSING_CODE), "")
    what = f"{report.gpus_missing} expected GPU(s) missing ({GPU_MISSING_CODE})"
    return f"{what}: {said}" if said else what


def desired_node(
    report: NodeHealth,
    settings: PolicySettings,
    keys: Keys,
    *,
    excluded: bool = False,
    quarantine: Taint | None = None,
    hold: Hold | None = None,
) -> DesiredNode:
    """``hold`` (or only its taint, ``quarantine``): what the remediation loop holds while an
    episode holds the node (``gpuhealth.controller.remediation.taint``); its taint joins the
    taints whatever the GPUs report, so a node whose GPU recovered after a reset stays off
    limits until it is validated, and while it holds the node the autoscalers are asked to
    keep their hands off it (``policy.disruption_guard``). An excluded node is the operator's:
    nothing is held."""
    if hold is None and quarantine is not None:
        hold = Hold(quarantine)
    desired = dataclasses.replace(
        _desired(report, settings, keys, excluded=excluded), cordon=settings.cordon
    )
    if hold is None or excluded:
        return desired
    guard = None if hold.guard is None else hold.guard and settings.disruption_guard
    return dataclasses.replace(
        desired,
        taints=desired.taints | {hold.taint} if hold.taint is not None else desired.taints,
        guard=guard,
        cordon_always=hold.cordon,
    )


def _desired(
    report: NodeHealth, settings: PolicySettings, keys: Keys, *, excluded: bool
) -> DesiredNode:
    if excluded:
        return DesiredNode(
            taints=frozenset(), authoritative=True, manage_meta=False, state="excluded"
        )
    if report.reporting == "no-data":
        return DesiredNode(taints=frozenset(), authoritative=False, manage_meta=False)
    if report.reporting == "missing":
        return _desired_when_missing(settings, keys)
    if report.reporting == "silent":
        taints = frozenset(
            {Taint(keys.unhealthy_taint, AGENT_SILENT_CODE, "NoSchedule")}
            if settings.taint_on_agent_silent
            else set()
        )
        cond = NodeCondition(
            "Unknown",
            REASON_AGENT_NOT_REPORTING,
            "the gpuhealth agent on this node stopped reporting",
        )
        return DesiredNode(
            taints=taints,
            authoritative=False,
            manage_meta=True,
            labels=((keys.state_label, "unknown"),),
            condition=cond,
            state="unknown",
        )
    return _desired_when_reporting(report, settings, keys)


def _desired_when_missing(settings: PolicySettings, keys: Keys) -> DesiredNode:
    """A GPU node no agent reports for (``gpuhealth.controller.incidents.unwatched``): nobody can
    vouch for its GPUs. Reported (condition, label); tainted only with
    ``taint_on_agent_missing``."""
    taints = frozenset(
        {Taint(keys.unhealthy_taint, AGENT_MISSING_CODE, "NoSchedule")}
        if settings.taint_on_agent_missing
        else set()
    )
    cond = NodeCondition(
        "Unknown", REASON_AGENT_MISSING, "no gpuhealth agent reports for this GPU node"
    )
    return DesiredNode(
        taints=taints,
        authoritative=False,
        manage_meta=True,
        labels=((keys.state_label, "unknown"),),
        condition=cond,
        state="unknown",
    )


def _desired_when_reporting(
    report: NodeHealth, settings: PolicySettings, keys: Keys
) -> DesiredNode:
    unhealthy = [g for g in report.gpus if g.state == "unhealthy"]
    degraded = [g for g in report.gpus if g.state in ("degraded", "unknown")]
    healthy = len(report.gpus) - len(unhealthy) - len(degraded)
    missing = report.gpus_missing
    taints: set[Taint] = set()
    if settings.unhealthy_policy == "any":
        hard = bool(unhealthy) or missing > 0
    else:
        hard = healthy < settings.min_healthy_gpus
    codes = [gpu_code(g) for g in unhealthy] + [GPU_MISSING_CODE] * bool(missing)
    codes += [gpu_code(g) for g in degraded]
    if hard:
        taints.add(
            Taint(keys.unhealthy_taint, codes[0] if codes else "too-few-healthy", "NoSchedule")
        )
        unhealthy_codes = [c.code for g in unhealthy for c in g.conditions]
        unhealthy_codes += [GPU_MISSING_CODE] * bool(missing)
        evict = next((c for c in unhealthy_codes if c in settings.noexecute_codes), None)
        if evict is not None:
            taints.add(Taint(keys.unhealthy_taint, evict, "NoExecute"))
    elif settings.degraded_taint and codes:
        taints.add(Taint(keys.degraded_taint, codes[0], "PreferNoSchedule"))

    if unhealthy or missing:
        state = "unhealthy"
        first = primary_condition(unhealthy[0]) if unhealthy else None
        reason = (
            first.reason if first else REASON_GPU_MISSING if not unhealthy else REASON_GPU_UNHEALTHY
        )
        described = [_describe(unhealthy)] if unhealthy else []
        if missing:
            described.insert(0, _describe_missing(report))
        cond = NodeCondition("False", reason, _clip("; ".join(described)))
    elif degraded:
        state = worst_state(g.state for g in degraded)
        cond = NodeCondition("True", REASON_GPU_DEGRADED, _describe(degraded))
    else:
        state = "healthy"
        cond = NodeCondition("True", REASON_ALL_GPUS_HEALTHY, f"{healthy} GPUs healthy")
    labels = ((keys.state_label, state), (keys.healthy_gpus_label, str(healthy)))
    devices = tuple(device_verdict(g) for g in unhealthy)
    return DesiredNode(
        taints=frozenset(taints),
        authoritative=True,
        manage_meta=True,
        labels=labels,
        condition=cond,
        devices=devices,
        state=state,
    )
