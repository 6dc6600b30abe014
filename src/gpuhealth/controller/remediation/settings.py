"""Settings of the remediation loop: the ``remediation`` section of the controller config.

Off by default, and each action is turned on separately (``reset_gpu``, ``reboot``,
``escalate``). Every timeout, interval, limit and threshold is here with its default and
its bounds (checked when the file is loaded). docs/remediation.md explains them.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from gpuhealth.common.config import (
    LabelKey,
    LabelValue,
    PositiveSeconds,
    Ratio,
    Seconds,
    SettingError,
    Settings,
)
from gpuhealth.controller.names import (
    ACCELERATED_HARDWARE_READY,
    AKS_AGENTPOOL_LABEL,
    AKS_AUTO_REPAIR,
    CONTAINER_RUNTIME_READY,
    EKS_AUTO_REPAIR,
    GKE_AUTO_REPAIR,
    GKE_NODEPOOL_LABEL,
    KERNEL_READY,
    NETWORKING_READY,
    NODE_READY_CONDITION,
    STORAGE_READY,
)

Count = Annotated[int, Meta(ge=1, le=100_000)]

DrainMode = Literal["evict", "wait", "never"]
"""``evict``: evict at once; ``wait``: let the pod finish for up to ``wait_s``, then evict;
``never``: never evict (the drain waits, and its timeout applies)."""
GangKind = Literal["jobset", "volcano", "kueue", "coscheduling", "leaderworkerset", "job"]

DEFAULT_ACTION_MAP: dict[str, str] = {
    "RESET_GPU": "reset-gpu",
    "RESTART_BM": "reboot",
    "RESTART_VM": "reboot",
    "CONTACT_SUPPORT": "escalate",
    "CHECK_MECHANICALS": "escalate",
    "CHECK_COOLING": "escalate",
    "RUN_DIAGNOSTICS": "reset-gpu",
}
"""``RUN_DIAGNOSTICS`` reaches the loop only from an unhealthy GPU: one the controller blamed
(``gpu-blamed``, controller/incidents); it is reset, then validated with the diagnostic."""


class ResetSettings(Settings, frozen=True, kw_only=True):
    enabled: bool = False
    """Reset failed GPUs (verdict action RESET_GPU) through the agent."""
    scope: Literal["gpu", "node"] = "gpu"
    """``gpu``: drain only the pods on the failed GPUs (and their gangs). ``node``: drain the
    whole node first (systems where a reset needs every GPU idle, e.g. some NVSwitch boards)."""
    max_attempts: Annotated[int, Meta(ge=1, le=10)] = 2
    """Reset orders per episode (a refusal or failure counts); then the episode escalates."""
    retry_s: Seconds = 60.0
    """Wait after a refused or failed reset before the next attempt."""
    order_timeout_s: PositiveSeconds = 120.0
    """No report for this long: send the same order again (the agent dedups by order id)."""
    timeout_s: PositiveSeconds = 1800.0
    """Longest time in Remediating for a reset; then escalate."""

    def check(self) -> None:
        if self.order_timeout_s > self.timeout_s:
            raise SettingError("order_timeout_s", "must not exceed timeout_s")


class RebootSettings(Settings, frozen=True, kw_only=True):
    enabled: bool = False
    """Reboot nodes whose verdict says RESTART_BM / RESTART_VM."""
    approval_required: bool = True
    """Wait for ``<prefix>/approve`` on the GPURemediation before draining for a reboot. The
    episode waits in Pending (holding no concurrency slot)."""
    approval_expiry_s: PositiveSeconds = 86400.0
    """How long after its fault was detected an approval request stands: a reboot episode
    not approved and admitted by then fails ``ApprovalExpired`` (a later approval does
    nothing; the fault and the boot id are checked again before the drain either way)."""
    executor: Literal["agent", "external"] = "agent"
    """``agent``: the agent's reboot executor (a node command, or its webhook). ``external``:
    nothing is sent; a cloud/BMC integration watches GPURemediations in Remediating with
    action reboot and reboots the node (the CR is the hand-off)."""
    order_timeout_s: PositiveSeconds = 120.0
    """No report for this long: send the same reboot order again (the agent dedups by order id)."""
    timeout_s: PositiveSeconds = 3600.0
    """Longest wait for the new boot id; then escalate."""

    def check(self) -> None:
        if self.order_timeout_s > self.timeout_s:
            raise SettingError("order_timeout_s", "must not exceed timeout_s")


class EscalateSettings(Settings, frozen=True, kw_only=True):
    enabled: bool = False
    """Open episodes for CONTACT_SUPPORT verdicts: quarantine, then the RMA label and Event.
    (Failures of the other actions always escalate.)"""


class DrainRule(Settings, frozen=True, kw_only=True):
    namespaces: Annotated[tuple[str, ...], Meta(min_length=1, max_length=256)]
    """Names or shell-style patterns (``team-*``); the first rule that matches applies."""
    mode: DrainMode = "evict"
    wait_s: Seconds = 0.0
    """``wait`` mode: how long a pod may run on after the drain started."""
    grace_period_s: Annotated[int, Meta(ge=0, le=86400)] | None = None
    """Eviction grace period; None = the pod's own terminationGracePeriodSeconds."""
    force: bool = False
    """With ``drain.on_timeout: force``: delete this namespace's pods that were evicted but
    are still terminating when the drain times out (never a pod a PDB protects)."""


class GangSettings(Settings, frozen=True, kw_only=True):
    enabled: bool = True
    """Evict every pod of a job together (also on other nodes): a partial gang only burns
    the healthy GPUs."""
    kinds: tuple[GangKind, ...] = (
        "jobset",
        "volcano",
        "kueue",
        "coscheduling",
        "leaderworkerset",
    )
    """Grouping rules, most specific first (a JobSet's pods also carry Job labels). ``job``
    (every pod of a plain batch Job is one gang) is opt-in: add it last, since a parallel
    Job's pods are usually independent workers."""
    max_pods: Count = 1024
    """A gang larger than this is not evicted (the episode is held, then its drain times
    out); ``drain.max_pods`` is usually the tighter limit."""

    def check(self) -> None:
        if len(set(self.kinds)) != len(self.kinds):
            raise SettingError("kinds", "lists a kind twice")


class DrainSettings(Settings, frozen=True, kw_only=True):
    rules: tuple[DrainRule, ...] = ()
    """Per-namespace drain rules (mode, wait, grace period, force); the first match applies."""
    default_mode: DrainMode = "evict"
    """Mode of namespaces no rule matches."""
    default_wait_s: Seconds = 0.0
    """``wait`` time of namespaces no rule matches."""
    grace_period_s: Annotated[int, Meta(ge=0, le=86400)] | None = None
    """Eviction grace period of namespaces no rule matches; None = the pod's own."""
    timeout_s: PositiveSeconds = 3600.0
    """Longest drain; then ``on_timeout``."""
    on_timeout: Literal["escalate", "force"] = "escalate"
    """``force``: delete stuck terminating pods where the namespace rule allows, then go on;
    pods that are still PDB-blocked or ``never`` always escalate."""
    stuck_after_s: Seconds = 300.0
    """An evicted pod still terminating this long past its grace period counts as stuck."""
    retry_s: PositiveSeconds = 15.0
    """Interval between eviction rounds (a 429 from a PodDisruptionBudget waits this long)."""
    protected_labels: dict[str, str] = msgspec.field(
        default_factory=lambda: {"app.kubernetes.io/name": "gpuhealth"}
    )
    """gpuhealth's own pods are never evicted: those carrying any of these labels *and*
    controlled by a ReplicaSet or DaemonSet in gpuhealth's namespace (``leader.namespace``).
    The label alone, which any tenant can set, protects nothing."""
    gang: GangSettings = msgspec.field(default_factory=GangSettings)
    max_pods: Annotated[int, Meta(ge=1, le=1000)] = 64
    """Most pods one episode evicts, on its node and elsewhere (gang members) together. A
    drain that would evict more is held whole (reason ``BlastRadiusCap``, an Event, the
    ``gpuhealth_remediation_holds_total`` metric), never started in part; its timeout then
    escalates."""
    max_other_nodes: Annotated[int, Meta(ge=0, le=1000)] = 4
    """Most other nodes one episode evicts pods from (members of a gang). Each is charged to
    the circuit breaker before the first eviction. More: held whole, like ``max_pods``."""

    def check(self) -> None:
        if self.retry_s >= self.timeout_s:
            raise SettingError("retry_s", "must be shorter than timeout_s")
        waits = [self.default_wait_s] + [r.wait_s for r in self.rules if r.mode == "wait"]
        if max(waits) >= self.timeout_s:
            raise SettingError("rules", "a wait_s must be shorter than drain timeout_s")


class ValidationPodSettings(Settings, frozen=True, kw_only=True):
    namespace: Annotated[str, Meta(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]
    """Namespace the validation pod runs in."""
    spec: dict[str, object]
    """A PodSpec (a CUDA/NCCL smoke test); the loop sets nodeName and tolerations."""
    timeout_s: PositiveSeconds = 900.0
    """The pod's ``activeDeadlineSeconds`` (unless its spec sets one): the kubelet stops a
    validation pod still running after this, it ends Failed, and so does the validation."""

    def check(self) -> None:
        containers = self.spec.get("containers")
        if not isinstance(containers, list) or not containers:
            raise SettingError("spec", "needs a non-empty containers list (a PodSpec)")


class ValidationSettings(Settings, frozen=True, kw_only=True):
    soak_s: Seconds = 300.0
    """The agent watches the GPUs stay clean this long before it reports success."""
    diagnostic: bool = False
    """Also run the agent's diagnostic hook (``dcgmi diag -r 1``). A node that cannot run it
    (dcgmi not in the image) fails validation (``diagnostic-unavailable``): escalated."""
    report_grace_s: PositiveSeconds = 300.0
    """How long after the soak (plus diagnostic) the report may take before a resend."""
    timeout_s: PositiveSeconds = 3600.0
    """Longest time in Validating; then escalate."""
    pod: ValidationPodSettings | None = None

    def check(self) -> None:
        if self.soak_s + self.report_grace_s > self.timeout_s:
            raise SettingError("timeout_s", "must cover soak_s + report_grace_s")


class SafetySettings(Settings, frozen=True, kw_only=True):
    max_concurrent: Count = 1
    """Episodes past Pending at once (absolute)."""
    max_fraction: Ratio = 0.05
    """... and as a fraction of GPU nodes; the lower limit wins, never below 1."""
    pool_max_concurrent: Count | None = None
    """Episodes past Pending at once within one named node pool (``fleet.pool_labels``),
    besides the fleet-wide cap; unset: ``max_concurrent``."""
    pool_max_fraction: Ratio | None = None
    """... and as a fraction of the pool's GPU nodes; the lower limit wins, never below 1;
    unset: ``max_fraction``. Nodes in no pool have only the fleet-wide cap."""
    max_unresolved_escalations: Count = 3
    """With this many Escalated episodes not yet released, no new episode starts (a
    systemic problem, e.g. a bad driver, must not sweep through the fleet)."""
    repeat_window_s: PositiveSeconds = 7 * 86400.0
    """The window ``repeat_limit`` counts a node's episodes in."""
    repeat_limit: Count = 2
    """A node with this many episodes within ``repeat_window_s`` escalates the next fault
    instead of remediating it again (never loop)."""
    history_s: PositiveSeconds = 30 * 86400.0
    """Finished episodes are kept this long (they also stop a stale event re-starting one)."""


ConditionStatus = Literal["True", "False", "Unknown"]


class ManagedRepairRule(Settings, frozen=True, kw_only=True):
    """One sign, visible on the Node, that a managed repairer owns its repair."""

    owner: Annotated[str, Meta(min_length=1, max_length=63)]
    """Who owns the repair, as gpuhealth records it (``eks-node-auto-repair`` ...)."""
    condition: str = ""
    """A Node condition type; with ``statuses``: the rule matches while the node has it in one
    of them. Empty: the label alone."""
    statuses: tuple[ConditionStatus, ...] = ("False",)
    label: LabelKey | None = None
    """Only nodes carrying this label (the cloud's own, so a rule for one cloud never matches
    another's nodes); with ``condition`` empty, the label alone."""
    label_value: LabelValue | None = None
    """With ``label``: only this value."""

    def check(self) -> None:
        if not self.condition and self.label is None:
            raise SettingError("condition", "a rule needs a condition, a label or both")
        if self.condition and not self.statuses:
            raise SettingError("statuses", "a condition rule needs at least one status")


DEFAULT_MANAGED_REPAIR_RULES: tuple[ManagedRepairRule, ...] = (
    *(
        ManagedRepairRule(owner=EKS_AUTO_REPAIR, condition=condition)
        for condition in (
            ACCELERATED_HARDWARE_READY,
            KERNEL_READY,
            NETWORKING_READY,
            STORAGE_READY,
            CONTAINER_RUNTIME_READY,
        )
    ),
    ManagedRepairRule(
        owner=AKS_AUTO_REPAIR,
        condition=NODE_READY_CONDITION,
        statuses=("False", "Unknown"),
        label=AKS_AGENTPOOL_LABEL,
    ),
    ManagedRepairRule(
        owner=GKE_AUTO_REPAIR,
        condition=NODE_READY_CONDITION,
        statuses=("False", "Unknown"),
        label=GKE_NODEPOOL_LABEL,
    ),
)
"""EKS: the node monitoring agent's conditions False (EKS node auto repair, or Karpenter's
node repair, replaces or reboots the node). AKS and GKE: an AKS or GKE node not Ready (their
auto-repair, on by default, reboots, reimages or re-creates it)."""


class ManagedRepairSettings(Settings, frozen=True, kw_only=True):
    enabled: bool = True
    """Look for a managed repairer (EKS node auto repair, AKS and GKE auto-repair) on a node
    before gpuhealth takes a disruptive step there: while one of ``rules`` matches the Node,
    gpuhealth keeps its taint, records who owns the repair (the episode's status, an Event,
    ``gpuhealth_remediation_managed_repairs_total``), takes no disruptive step (the episode is
    held, ``ManagedRepair``), asks for no replacement and sets no autoscaler annotation (it
    does not stand in the repairer's way). Off: gpuhealth ignores managed repair (turn it off
    where the signals are there but nothing repairs, e.g. the EKS node monitoring agent
    without node auto repair)."""
    rules: Annotated[tuple[ManagedRepairRule, ...], Meta(max_length=64)] = (
        DEFAULT_MANAGED_REPAIR_RULES
    )
    """The signs of a managed repairer, tried in order (the first that matches names the
    owner): by default the EKS node monitoring agent's conditions (``AcceleratedHardwareReady``,
    ``KernelReady``, ``NetworkingReady``, ``StorageReady``, ``ContainerRuntimeReady`` False),
    and an AKS or GKE node (its pool label) not ``Ready``."""

    def watched(self) -> dict[str, frozenset[str]]:
        """The Node conditions the node cache keeps for these rules, with their statuses."""
        out: dict[str, set[str]] = {}
        if self.enabled:
            for rule in self.rules:
                if rule.condition:
                    out.setdefault(rule.condition, set()).update(rule.statuses)
        return {kind: frozenset(statuses) for kind, statuses in out.items()}


ReplaceMethod = Literal["nodeclaim", "node"]
"""``nodeclaim``: delete the Node's Karpenter NodeClaim (Karpenter drains the node and launches
another); ``node``: cordon and drain the node, then delete the Node (cluster-autoscaler, a cloud
node lifecycle, brings a new one)."""


class ReplacePool(Settings, frozen=True, kw_only=True):
    pool: Annotated[LabelValue, Meta(min_length=1)]
    """A node pool (``fleet.pool_labels``) whose escalated nodes are replaced."""
    method: ReplaceMethod = "nodeclaim"


class ReplaceSettings(Settings, frozen=True, kw_only=True):
    enabled: bool = False
    """After an escalation, ask for a replacement of the node where its pool allows it
    (``pools``). The GPURemediation keeps the record (the fault, the RMA reason, the
    replacement) after the Node is gone. Off: an escalated node waits for a person."""
    pools: Annotated[tuple[ReplacePool, ...], Meta(max_length=256)] = ()
    """The pools whose escalated nodes are replaced, and how (opt-in per pool); an escalated
    node of another pool, or of none, is not (``NodeReplacementSkipped``)."""
    drain_timeout_s: PositiveSeconds = 3600.0
    """``method: node``: the longest drain of the cordoned node before its Node is deleted;
    past it the replacement fails (``DrainTimeout``), nothing is deleted and the node stays
    escalated for a person."""

    def check(self) -> None:
        names = [p.pool for p in self.pools]
        if len(set(names)) != len(names):
            raise SettingError("pools", "lists a pool twice")

    def method_for(self, pool: str) -> ReplaceMethod | None:
        """How ``pool``'s escalated nodes are replaced, None when they are not."""
        if not self.enabled:
            return None
        return next((p.method for p in self.pools if p.pool == pool), None)


class RemediationSettings(Settings, frozen=True, kw_only=True):
    enabled: bool = False
    """The whole loop. Off: no GPURemediation is created and none is acted on."""
    dry_run: bool = False
    """Record episodes and their plans (what would be evicted, which action); change nothing."""
    reset_gpu: ResetSettings = msgspec.field(default_factory=ResetSettings)
    reboot: RebootSettings = msgspec.field(default_factory=RebootSettings)
    escalate: EscalateSettings = msgspec.field(default_factory=EscalateSettings)
    action_map: dict[str, Literal["reset-gpu", "reboot", "escalate"]] = msgspec.field(
        default_factory=lambda: dict(DEFAULT_ACTION_MAP)  # type: ignore[arg-type]
    )
    """Verdict action -> remediation action; unmapped actions start no episode."""
    drain: DrainSettings = msgspec.field(default_factory=DrainSettings)
    validation: ValidationSettings = msgspec.field(default_factory=ValidationSettings)
    safety: SafetySettings = msgspec.field(default_factory=SafetySettings)
    replace: ReplaceSettings = msgspec.field(default_factory=ReplaceSettings)
    """Replace as an action: an escalated node of a pool that allows it is replaced
    (docs/remediation.md "Replacing an escalated node")."""
    managed_repair: ManagedRepairSettings = msgspec.field(default_factory=ManagedRepairSettings)
    """One owner per repair: where a managed repairer owns a node, gpuhealth taints and
    records, and leaves the repair to it (docs/remediation.md "Managed repair")."""
    undelivered_retry_s: PositiveSeconds = 10.0
    """An order that found no live agent stream is sent again after this."""
    quarantine_check_s: PositiveSeconds = 5.0
    """How often an episode looks again for its quarantine taint or the removal of it."""
    workers: Annotated[int, Meta(ge=1, le=256)] = 4
    """Episodes reconciled concurrently."""
    resync_s: PositiveSeconds = 60.0
    """Every episode is looked at this often even without a change."""
    request_timeout_s: PositiveSeconds = 10.0
    """Deadline of one API request of the loop (GPURemediations, pods, evictions, Events)."""

    def action_enabled(self, action: str) -> bool:
        if action == "reset-gpu":
            return self.reset_gpu.enabled
        if action == "reboot":
            return self.reboot.enabled
        return action == "escalate" and self.escalate.enabled
