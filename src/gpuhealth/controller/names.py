"""Every name gpuhealth writes or reads on Kubernetes objects, in one place.

- :class:`Keys`: the taint keys, labels and annotations under the controller's ``prefix``
  setting (default :data:`DEFAULT_PREFIX`), each one ``<prefix>/<name>``. Everything under
  the prefix is gpuhealth's: the reconciler and the uninstall cleanup remove what they do not
  want there (:meth:`Keys.owns`), except the operator's inputs (:meth:`Keys.operator_labels`).
  The operator's overrides on a Node (exclude, remediation opt-out) are the exception: they
  live under :data:`NODE_RESTRICTION_PREFIX` as ``<prefix>-<name>``, where NodeRestriction
  keeps a node's own kubelet from setting them; the old ``<prefix>/exclude`` and
  ``<prefix>/remediation`` labels are read only to warn that they are ignored.
- The fixed names: the Node condition type and its reasons, the reasons of the Kubernetes
  Events the controller posts, the label values it reads, and how it marks what it creates.

Wire names are contracts: docs/operations.md ("What the controller writes") lists each of
them, and the chart (``deploy/helm/gpuhealth``: its ``keyPrefix``, tolerations, RBAC and CRD)
spells the same; ``tests/unit/controller/test_names.py`` holds both to this module, and no
other product module spells a name of ours or the default prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PREFIX = "gpuhealth.io"
"""The default of the ``prefix`` setting (the chart's ``keyPrefix``)."""

NODE_RESTRICTION_PREFIX = "node-restriction.kubernetes.io"
"""Labels under it are refused to kubelets by the NodeRestriction admission plugin (every
managed cluster runs it): the operator's overrides on a Node live there, so that nothing a
node's own identity can write lifts a gpuhealth decision."""
LABEL_NAME_MAX = 63
"""Most characters of a label key's name part (after the ``/``): an override label's
``<prefix>-<name>`` must fit, so the prefix is at most this less ``-remediation``."""

API_GROUP = "gpuhealth.io"
"""gpuhealth's own API group, whatever the prefix: the ``GPURemediation`` CRD's, and the
resources the operator's SubjectAccessReviews name (``circuitbreakers``, ``fleet``)."""


@dataclass(frozen=True, slots=True)
class Keys:
    """The keys gpuhealth owns under its prefix: taints, labels, annotations."""

    prefix: str = DEFAULT_PREFIX

    def owns(self, key: str) -> bool:
        return key.startswith(self.prefix + "/")

    def operator_labels(self) -> frozenset[str]:
        """Labels operators set and the controller only reads (never removed, also not by the
        uninstall cleanup): the overrides, and their old names under the prefix (ignored now,
        but a person's)."""
        return frozenset({self.exclude_label, self.opt_out_label, *self.moved_override_labels()})

    def moved_override_labels(self) -> dict[str, str]:
        """Each old override label (under the prefix, which a node's kubelet may set) to the
        label that replaced it: the old ones are ignored, with a Warning Event naming the new
        one."""
        return {
            self.old_exclude_label: self.exclude_label,
            self.old_opt_out_label: self.opt_out_label,
        }

    def taint_keys(self) -> tuple[str, ...]:
        """Every taint key gpuhealth writes on Nodes (the agent tolerates each of them)."""
        return (self.unhealthy_taint, self.degraded_taint, self.domain_taint, self.quarantine_taint)

    # -- taints on Nodes -------------------------------------------------------------------

    @property
    def unhealthy_taint(self) -> str:
        """``<prefix>/unhealthy=<code>:NoSchedule`` (``NoExecute`` for configured codes)."""
        return f"{self.prefix}/unhealthy"

    @property
    def degraded_taint(self) -> str:
        """``<prefix>/degraded=<code>:PreferNoSchedule``."""
        return f"{self.prefix}/degraded"

    @property
    def domain_taint(self) -> str:
        """The NVLink domain incident's taint
        (``gpuhealth.controller.incidents.domain_monitor``)."""
        return f"{self.prefix}/nvlink-domain"

    @property
    def quarantine_taint(self) -> str:
        """``<prefix>/remediation=<action>:NoSchedule`` while a remediation episode holds the
        node (``gpuhealth.controller.remediation.taint``)."""
        return f"{self.prefix}/remediation"

    # -- labels on Nodes -------------------------------------------------------------------

    @property
    def state_label(self) -> str:
        """The node's worst GPU state."""
        return f"{self.prefix}/state"

    @property
    def healthy_gpus_label(self) -> str:
        return f"{self.prefix}/healthy-gpus"

    @property
    def exclude_label(self) -> str:
        """``node-restriction.kubernetes.io/<prefix>-exclude=true`` (:data:`EXCLUDE_VALUE`),
        set by an operator: gpuhealth hands the node to a person (read only)."""
        return f"{NODE_RESTRICTION_PREFIX}/{self.prefix}-exclude"

    @property
    def opt_out_label(self) -> str:
        """``node-restriction.kubernetes.io/<prefix>-remediation=disabled``
        (:data:`OPT_OUT_VALUE`), set by an operator: no remediation episode acts on the node
        (read only)."""
        return f"{NODE_RESTRICTION_PREFIX}/{self.prefix}-remediation"

    @property
    def shard_label(self) -> str:
        """``node-restriction.kubernetes.io/<prefix>-shard=<i>``: the node's shard past one
        process, written by the controller's singleton; NodeRestriction keeps a node's own
        kubelet from moving itself into a shard nobody owns."""
        return f"{NODE_RESTRICTION_PREFIX}/{self.prefix}-shard"

    @property
    def old_exclude_label(self) -> str:
        """``<prefix>/exclude``: the exclude label before it moved (a node's kubelet may set
        it): ignored, with a Warning Event naming :attr:`exclude_label`."""
        return f"{self.prefix}/exclude"

    @property
    def old_opt_out_label(self) -> str:
        """``<prefix>/remediation``: the remediation opt-out before it moved: ignored, with a
        Warning Event naming :attr:`opt_out_label`."""
        return f"{self.prefix}/remediation"

    @property
    def rma_label(self) -> str:
        """Set on a Node whose remediation episode escalated; the value says why."""
        return f"{self.prefix}/rma"

    # -- annotations on Nodes --------------------------------------------------------------

    @property
    def applied_annotation(self) -> str:
        """The taints gpuhealth last wrote, as earlier versions kept them: no longer written
        nor read (a node's own identity can write it); removed with the next patch of the
        node's taints."""
        return f"{self.prefix}/applied-taints"

    @property
    def acknowledged_annotation(self) -> str:
        """Earlier versions' acknowledgements of hand-removed taints: ignored (a node's own
        identity can write it), named in a Warning Event; override incidents
        (GPUIncidents of kind ``override``) replace it."""
        return f"{self.prefix}/acknowledged-taints"

    @property
    def guards_annotation(self) -> str:
        """What gpuhealth set on the Node besides its taints while it holds the node, and
        lifts when it lets go (only what it set): the autoscalers' annotations
        (:data:`DISRUPTION_GUARDS`) and the cordon (:data:`CORDON_FIELD`), comma-separated
        (``gpuhealth.controller.taints.plan``)."""
        return f"{self.prefix}/guards"

    # -- GPURemediations and their validation pods -------------------------------------------

    @property
    def node_label(self) -> str:
        """On a GPURemediation and on a DeviceTaintRule: its node."""
        return f"{self.prefix}/node"

    @property
    def approve_annotation(self) -> str:
        """An operator's approval of a GPURemediation that waits for one."""
        return f"{self.prefix}/approve"

    @property
    def abort_annotation(self) -> str:
        """An operator's abort of a GPURemediation (its value says why)."""
        return f"{self.prefix}/abort"

    @property
    def release_annotation(self) -> str:
        """An operator's release of an escalated GPURemediation (re-validates the node)."""
        return f"{self.prefix}/release"

    @property
    def episode_label(self) -> str:
        """On a validation pod: the fingerprint of the episode it belongs to."""
        return f"{self.prefix}/remediation-episode"

    # -- GPUIncidents ---------------------------------------------------------------------------

    @property
    def incident_kind_label(self) -> str:
        """On a GPUIncident: its kind (``job``, ``gpu``, ``domain``, ``unwatched``,
        ``override``), for selectors."""
        return f"{self.prefix}/incident-kind"

    @property
    def incident_state_label(self) -> str:
        """On a GPUIncident: ``open`` or ``closed``, for selectors."""
        return f"{self.prefix}/incident-state"

    # -- DeviceTaintRules ----------------------------------------------------------------------

    @property
    def managed_label(self) -> str:
        """``<prefix>/managed=true`` (:data:`MANAGED_VALUE`) marks the DeviceTaintRules
        gpuhealth created."""
        return f"{self.prefix}/managed"

    @property
    def gpu_uuid_annotation(self) -> str:
        """The GPU a DeviceTaintRule is about."""
        return f"{self.prefix}/gpu-uuid"

    @property
    def device_uuid_annotation(self) -> str:
        """The MIG device a DeviceTaintRule is about (a MIG device's rule only)."""
        return f"{self.prefix}/device-uuid"

    # -- Pods --------------------------------------------------------------------------------

    @property
    def idle_annotation(self) -> str:
        """The idle-allocation annotation on a Pod (the default of ``idle.annotation_key``)."""
        return f"{self.prefix}/idle-since"


EXCLUDE_VALUE = "true"
"""The value of :attr:`Keys.exclude_label` that excludes a node."""
OPT_OUT_VALUE = "disabled"
"""The value of :attr:`Keys.opt_out_label` that keeps the remediation loop off a node."""
MANAGED_VALUE = "true"
"""The value of :attr:`Keys.managed_label` on gpuhealth's DeviceTaintRules."""

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
"""Kubernetes' recommended label, set on what the controller creates."""
CONTROLLER = "gpuhealth-controller"
"""The controller as the maker of objects: :data:`MANAGED_BY_LABEL` on its GPURemediations and
validation pods, and the ``source.component`` of its Events."""
ENDPOINT_SLICE_MANAGER = "gpuhealth-controller.gpuhealth.io"
"""``endpointslice.kubernetes.io/managed-by`` of the leader's EndpointSlice (Kubernetes' own
EndpointSlice controllers leave a slice managed by someone else alone)."""

# -- the Node condition -------------------------------------------------------------------------

CONDITION_TYPE = "GPUHealthy"
"""The Node condition gpuhealth writes (nodes/status) and reads back from the node cache."""
REASON_ALL_GPUS_HEALTHY = "AllGPUsHealthy"
"""``GPUHealthy=True``: every GPU healthy."""
REASON_GPU_DEGRADED = "GPUDegraded"
"""``GPUHealthy=True``: a GPU degraded (or its state unknown)."""
REASON_GPU_UNHEALTHY = "GPUUnhealthy"
"""``GPUHealthy=False`` when the worst GPU's condition gives no reason of its own."""
REASON_GPU_MISSING = "GpuMissing"
"""``GPUHealthy=False``: only expected GPUs missing (no GPU of the node unhealthy)."""
REASON_AGENT_NOT_REPORTING = "AgentNotReporting"
"""``GPUHealthy=Unknown``: the node's agent stopped reporting."""
REASON_AGENT_MISSING = "AgentMissing"
"""``GPUHealthy=Unknown``: a GPU node no agent reports for."""

# -- Kubernetes Event reasons ---------------------------------------------------------------------

EVENT_GPU_UNHEALTHY = "GPUUnhealthy"
"""On a Node whose condition turned False."""
EVENT_GPU_RECOVERED = "GPURecovered"
"""On a Node whose condition turned True again."""
EVENT_NODE_TAINTED = "NodeTainted"
EVENT_NODE_UNTAINTED = "NodeUntainted"
EVENT_TAINT_ACKNOWLEDGED = "TaintAcknowledged"
"""On a Node: a taint of ours removed by hand, not re-added while the verdict holds (an
override incident)."""
EVENT_OVERRIDE_IGNORED = "OverrideIgnored"
"""On a Node carrying an operator override where its own kubelet could have written it (an
old override label, the old ``acknowledged-taints`` annotation): ignored; the message names
where the override lives now."""
EVENT_CIRCUIT_BREAKER_OPEN = "CircuitBreakerOpen"
"""On a Node (and a GPURemediation) whose hard write the circuit breaker refused."""
EVENT_NVLINK_DOMAIN_INCIDENT = "NvlinkDomainIncident"
EVENT_NVLINK_DOMAIN_RECOVERED = "NvlinkDomainRecovered"
EVENT_NVLINK_DOMAIN_MISMATCH = "NvlinkDomainMismatch"
EVENT_GPU_IDLE = "GPUIdle"
"""On a Pod holding an idle GPU."""
EVENT_GPU_JOB_INCIDENT = "GPUJobIncident"
"""On a job (its owner) and its pods: the job, not a GPU, is blamed for its XIDs."""
EVENT_REMEDIATION_STARTED = "RemediationStarted"
EVENT_REMEDIATION_RELEASED = "RemediationReleased"
EVENT_REMEDIATION_ESCALATED = "RemediationEscalated"
EVENT_REMEDIATION_ABORTED = "RemediationAborted"
EVENT_MANAGED_REPAIR = "ManagedRepairOwnsNode"
"""On a GPURemediation and its Node: a managed repairer (EKS, AKS, GKE auto-repair) owns the
node's repair; gpuhealth keeps its taint and takes no disruptive step."""
EVENT_NODE_REPLACEMENT_REQUESTED = "NodeReplacementRequested"
"""On a GPURemediation and its Node: gpuhealth deleted the node's NodeClaim, or the Node."""
EVENT_NODE_REPLACEMENT_SKIPPED = "NodeReplacementSkipped"
"""On a GPURemediation: replacement is on, but not for this node (its pool does not allow it,
it is in no pool, a managed repairer owns it): nothing deleted."""
EVENT_NODE_REPLACEMENT_FAILED = "NodeReplacementFailed"
"""On a GPURemediation and its Node: the replacement could not be asked for (no NodeClaim,
one that is not the node's, the drain timed out): nothing deleted."""
EVENT_NODE_REPLACED = "NodeReplaced"
"""On a GPURemediation: the replaced Node is gone."""

# -- names of other projects that gpuhealth reads or writes on Nodes -----------------------------

KARPENTER_DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
"""Karpenter's annotation: no voluntary disruption (consolidation, drift, expiry) of the node.
gpuhealth sets it (``"true"``) while it holds a node."""
SCALE_DOWN_DISABLED = "cluster-autoscaler.kubernetes.io/scale-down-disabled"
"""cluster-autoscaler's annotation: the node is never scaled down. gpuhealth sets it
(``"true"``) while it holds a node."""
DISRUPTION_GUARDS = (KARPENTER_DO_NOT_DISRUPT, SCALE_DOWN_DISABLED)
"""The autoscalers' annotations gpuhealth sets while it holds a node (value
:data:`GUARD_VALUE`)."""
GUARD_VALUE = "true"
"""The value of each of :data:`DISRUPTION_GUARDS` gpuhealth writes (and the only one it
removes)."""
CORDON_FIELD = "spec.unschedulable"
"""The cordon, as :attr:`Keys.guards_annotation` lists it when gpuhealth set it."""

KARPENTER_NODEPOOL_LABEL = "karpenter.sh/nodepool"
EKS_NODEGROUP_LABEL = "eks.amazonaws.com/nodegroup"
GKE_NODEPOOL_LABEL = "cloud.google.com/gke-nodepool"
AKS_AGENTPOOL_LABEL = "kubernetes.azure.com/agentpool"
GENERIC_POOL_LABEL = "node.kubernetes.io/pool"
DEFAULT_POOL_LABELS = (
    KARPENTER_NODEPOOL_LABEL,
    EKS_NODEGROUP_LABEL,
    GKE_NODEPOOL_LABEL,
    AKS_AGENTPOOL_LABEL,
    GENERIC_POOL_LABEL,
)
"""Labels naming a Node's pool, tried in this order (the ``fleet.pool_labels`` default)."""

KARPENTER_GROUP = "karpenter.sh"
"""Karpenter's API group (NodeClaims, NodePools)."""
NODECLAIM_API_VERSION = f"{KARPENTER_GROUP}/v1"
"""The NodeClaim API gpuhealth reads and deletes (Karpenter v1)."""
NODECLAIM_KIND = "NodeClaim"
"""A Karpenter NodeClaim: a Node it launched names it in its ownerReferences, and the NodeClaim
names its Node in ``status.nodeName``."""
NODECLAIM_PLURAL = "nodeclaims"

NODE_READY_CONDITION = "Ready"
"""The kubelet's Node condition (AKS and GKE auto-repair act on it not being True)."""
ACCELERATED_HARDWARE_READY = "AcceleratedHardwareReady"
"""The EKS node monitoring agent's Node conditions (EKS node auto repair acts on them being
False): GPUs (XIDs, DCGM), and the kernel, network, storage and container runtime."""
KERNEL_READY = "KernelReady"
NETWORKING_READY = "NetworkingReady"
STORAGE_READY = "StorageReady"
CONTAINER_RUNTIME_READY = "ContainerRuntimeReady"
EKS_AUTO_REPAIR = "eks-node-auto-repair"
"""Who owns a repair, as gpuhealth records it (``remediation.managed_repair.rules``)."""
AKS_AUTO_REPAIR = "aks-node-auto-repair"
GKE_AUTO_REPAIR = "gke-node-auto-repair"
