"""The state machine, table-driven: every transition from (stored status, observations)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import msgspec
import pytest

from gpuhealth.controller.remediation.actions import (
    CreateValidationPod,
    Evict,
    ForceDelete,
    Quarantine,
    SendOrder,
    SetNodeLabel,
)
from gpuhealth.controller.remediation.facts import EpisodeAdmission, NodeFacts, Observed, PodFacts
from gpuhealth.controller.remediation.fault import episode_name, expected_spec, failed_gpus
from gpuhealth.controller.remediation.machine import step
from gpuhealth.controller.remediation.model import (
    Episode,
    OrderStatus,
    Phase,
    PodRecord,
    ValidationStatus,
    handled_release,
    initial_status,
)
from gpuhealth.controller.remediation.settings import (
    DrainRule,
    DrainSettings,
    RebootSettings,
    RemediationSettings,
    ValidationPodSettings,
    ValidationSettings,
)
from gpuhealth.controller.remediation.step import Context
from gpuhealth.controller.taints.policy import Taint
from gpuhealth.protocol.remediation import (
    ActionReport,
    CancelOrder,
    RebootOrder,
    ResetGpuOrder,
)
from tests.fakes.remediation_world import KEYS, T0, fault_condition, gpu_uuid, node_facts, pod
from tests.support.remediation import settings

NOW = T0 + timedelta(minutes=10)
TAINT = {"key": KEYS.quarantine_taint, "value": "reset-gpu", "effect": "NoSchedule"}
FAULTS = {
    "reset-gpu": fault_condition("xid-48", "RESET_GPU"),
    "reboot": fault_condition("xid-79", "RESTART_BM"),
    "escalate": fault_condition("row-remap-failure", "CONTACT_SUPPORT"),
}


def faulty_node(action: str = "reset-gpu", **kw: Any) -> NodeFacts:
    return node_facts(unhealthy={3: FAULTS[action]}, **kw)


def healthy_node(**kw: Any) -> NodeFacts:
    return node_facts(**kw)


def with_taint(n: NodeFacts) -> NodeFacts:
    return replace(n, taints=(TAINT,))


def episode(
    phase: Phase = Phase.PENDING,
    action: str = "reset-gpu",
    cfg: RemediationSettings | None = None,
    annotations: dict[str, str] | None = None,
    **status: Any,
) -> Episode:
    cfg = cfg or settings()
    n = faulty_node(action)
    spec = expected_spec(
        "node-a", "boot-1", failed_gpus(n), detected_at=T0, history=(), settings=cfg
    )
    assert spec is not None
    st = initial_status(T0)
    times = msgspec.structs.replace(
        st.times,
        quarantined=T0 if phase is not Phase.PENDING else None,
        draining=T0 if phase not in (Phase.PENDING, Phase.QUARANTINED) else None,
        remediating=T0 if phase in (Phase.REMEDIATING, Phase.VALIDATING, Phase.RETURNED) else None,
        drained=T0 if phase in (Phase.REMEDIATING, Phase.VALIDATING, Phase.RETURNED) else None,
        validating=T0 if phase in (Phase.VALIDATING,) else None,
        remediated=T0 if phase in (Phase.VALIDATING, Phase.RETURNED) else None,
        escalated=T0 if phase is Phase.ESCALATED else None,
        failed=T0 if phase is Phase.FAILED else None,
    )
    st = msgspec.structs.replace(st, phase=phase, times=times, boot_id_before="boot-1", **status)
    return Episode(
        name=episode_name("node-a", spec.fault.fingerprint),
        spec=spec,
        status=st,
        annotations=annotations or {},
    )


def report(ep: Episode, order: str, state: str, **kw: Any) -> ActionReport:
    kind = order.rsplit("-", 1)[0]
    return ActionReport(
        seq=1,
        node="node-a",
        order_id=f"{ep.spec.fault.fingerprint}-{order}",
        episode=ep.name,
        action=kind,
        state=state,
        at=NOW - timedelta(seconds=1),
        **kw,  # type: ignore[arg-type]
    )


def order(ep: Episode, name: str, **kw: Any) -> OrderStatus:
    kind, attempt = name.rsplit("-", 1)
    base = {"sent_at": NOW - timedelta(seconds=5), "delivered": True}
    return OrderStatus(
        id=f"{ep.spec.fault.fingerprint}-{name}",
        action=kind,
        attempt=int(attempt),
        **{**base, **kw},
    )


@dataclass
class Case:
    name: str
    ep: Episode
    node: NodeFacts | None
    want_phase: Phase
    want_reason: str
    want_actions: tuple[type, ...] = ()
    cfg: RemediationSettings = field(default_factory=settings)
    pods: tuple[PodFacts, ...] = ()
    admission: EpisodeAdmission = field(default_factory=lambda: EpisodeAdmission(True))
    report: Any = None
    now: Any = NOW


def cases() -> list[Case]:
    e = episode
    ok = faulty_node()
    on3 = pod("on-gpu3")
    alloc = (
        msgspec.convert(
            {
                "namespace": "work",
                "pod": "on-gpu3",
                "container": "c",
                "gpu_uuid": gpu_uuid(3),
                "device_id": gpu_uuid(3),
            },
            type=__import__("gpuhealth.protocol", fromlist=["Allocation"]).Allocation,
        ),
    )
    rem = e(Phase.REMEDIATING)
    rem_reboot = e(Phase.REMEDIATING, "reboot")
    val = e(Phase.VALIDATING, validation=ValidationStatus(started_at=T0))
    return [
        # Pending
        Case(
            "pending admitted -> quarantined", e(), ok, Phase.QUARANTINED, "Admitted", (Quarantine,)
        ),
        Case(
            "pending over the cap waits",
            e(),
            ok,
            Phase.PENDING,
            "ConcurrencyLimit",
            admission=EpisodeAdmission(False, "ConcurrencyLimit", "1 of 1"),
        ),
        Case("pending fault cleared -> failed", e(), healthy_node(), Phase.FAILED, "FaultCleared"),
        Case(
            "pending after a reboot -> failed",
            e(),
            faulty_node(boot_id="boot-2"),
            Phase.FAILED,
            "BootChanged",
        ),
        Case(
            # a new leader, or a restarted controller, before the node's agent reconnected:
            # nothing is known of its boot, so nothing is decided (was Failed BootChanged)
            "pending while the agent does not report waits",
            e(),
            replace(ok, reporting="no-data", boot_id=""),
            Phase.PENDING,
            "AwaitingAgent",
        ),
        Case(
            "pending opted out is held",
            e(),
            faulty_node(labels={KEYS.opt_out_label: "disabled"}),
            Phase.PENDING,
            "OptedOut",
        ),
        Case(
            "pending with the loop off is held",
            e(),
            ok,
            Phase.PENDING,
            "RemediationDisabled",
            cfg=settings(enabled=False),
        ),
        Case(
            "pending dry-run records a plan",
            e(),
            ok,
            Phase.PENDING,
            "DryRun",
            cfg=settings(dry_run=True),
        ),
        Case("node deleted -> failed", e(), None, Phase.FAILED, "NodeGone"),
        Case(
            "abort annotation -> failed",
            e(Phase.DRAINING, annotations={KEYS.abort_annotation: "me"}),
            with_taint(ok),
            Phase.FAILED,
            "Aborted",
        ),
        # Quarantined
        Case(
            "quarantined waits for the taint",
            e(Phase.QUARANTINED),
            ok,
            Phase.QUARANTINED,
            "AwaitingQuarantineTaint",
            (Quarantine,),
        ),
        Case(
            "quarantined with the taint -> draining",
            e(Phase.QUARANTINED),
            with_taint(ok),
            Phase.DRAINING,
            "Draining",
        ),
        Case(
            "reboot waits for approval",
            e(Phase.QUARANTINED, "reboot"),
            with_taint(faulty_node("reboot")),
            Phase.QUARANTINED,
            "AwaitingApproval",
            cfg=settings(reboot=RebootSettings(enabled=True, approval_required=True)),
        ),
        Case(
            "approved reboot -> draining",
            e(Phase.QUARANTINED, "reboot", annotations={KEYS.approve_annotation: "al"}),
            with_taint(faulty_node("reboot")),
            Phase.DRAINING,
            "Draining",
            cfg=settings(reboot=RebootSettings(enabled=True, approval_required=True)),
        ),
        Case(
            "contact support -> escalated",
            e(Phase.QUARANTINED, "escalate"),
            with_taint(faulty_node("escalate")),
            Phase.ESCALATED,
            "ContactSupport",
            (SetNodeLabel,),
        ),
        # Fresh facts: approval in Pending (no slot held), expiry, re-verified before the drain
        Case(
            "pending reboot waits for approval without quarantining",
            e(action="reboot"),
            faulty_node("reboot"),
            Phase.PENDING,
            "AwaitingApproval",
            cfg=settings(reboot=RebootSettings(enabled=True, approval_required=True)),
        ),
        Case(
            "approved pending reboot -> quarantined",
            e(action="reboot", annotations={KEYS.approve_annotation: "al"}),
            faulty_node("reboot"),
            Phase.QUARANTINED,
            "Admitted",
            (Quarantine,),
            cfg=settings(reboot=RebootSettings(enabled=True, approval_required=True)),
        ),
        Case(
            "an approval request expires",
            e(action="reboot"),
            faulty_node("reboot"),
            Phase.FAILED,
            "ApprovalExpired",
            cfg=settings(
                reboot=RebootSettings(enabled=True, approval_required=True, approval_expiry_s=60)
            ),
        ),
        Case(
            "an approval given after the expiry does nothing",
            e(action="reboot", annotations={KEYS.approve_annotation: "al"}),
            faulty_node("reboot"),
            Phase.FAILED,
            "ApprovalExpired",
            cfg=settings(
                reboot=RebootSettings(enabled=True, approval_required=True, approval_expiry_s=60)
            ),
        ),
        Case(
            "fault cleared before the drain -> validating, nothing evicted",
            e(Phase.QUARANTINED),
            with_taint(healthy_node()),
            Phase.VALIDATING,
            "FaultCleared",
        ),
        Case(
            "node rebooted before the drain -> validating",
            e(Phase.QUARANTINED, "reboot"),
            with_taint(faulty_node("reboot", boot_id="boot-2")),
            Phase.VALIDATING,
            "BootChanged",
        ),
        Case(
            "no drain while the agent is silent",
            e(Phase.QUARANTINED),
            with_taint(replace(ok, reporting="silent")),
            Phase.QUARANTINED,
            "AwaitingAgent",
        ),
        Case(
            "fault cleared during the drain -> validating, no eviction",
            e(Phase.DRAINING),
            with_taint(healthy_node(allocations=alloc)),
            Phase.VALIDATING,
            "FaultCleared",
            pods=(on3,),
        ),
        Case(
            "fault cleared before the reset order -> validating, no order",
            rem,
            with_taint(healthy_node()),
            Phase.VALIDATING,
            "FaultCleared",
        ),
        Case(
            "fault cleared before the reboot order -> validating, no order",
            rem_reboot,
            with_taint(healthy_node()),
            Phase.VALIDATING,
            "FaultCleared",
        ),
        # Capabilities before disruption
        Case(
            "an agent that does not say what it can do: pending waits, nothing quarantined",
            e(),
            replace(ok, capabilities=None),
            Phase.PENDING,
            "CapabilitiesUnknown",
        ),
        Case(
            "a reboot without an agent executor escalates before the quarantine and the drain",
            e(action="reboot"),
            replace(faulty_node("reboot"), capabilities=frozenset({"reset-gpu", "validate"})),
            Phase.ESCALATED,
            "NoExecutor",
            (),  # the agent's settings are at fault, not its GPUs: no RMA label
        ),
        Case(
            "an agent that cannot execute waits while the escalation limit is reached",
            e(action="reboot"),
            replace(faulty_node("reboot"), capabilities=frozenset({"reset-gpu", "validate"})),
            Phase.PENDING,
            "NoExecutor",
            admission=EpisodeAdmission(False, "TooManyEscalations", "3 escalated episodes"),
        ),
        Case(
            "an external reboot needs no agent executor",
            e(action="reboot"),
            replace(faulty_node("reboot"), capabilities=frozenset({"validate"})),
            Phase.QUARANTINED,
            "Admitted",
            (Quarantine,),
            cfg=settings(
                reboot=RebootSettings(enabled=True, approval_required=False, executor="external")
            ),
        ),
        Case(
            "a diagnostic the agent cannot run escalates before the drain",
            e(Phase.QUARANTINED),
            with_taint(replace(ok, capabilities=frozenset({"reset-gpu", "validate"}))),
            Phase.ESCALATED,
            "NoExecutor",
            (),
            cfg=settings(validation=ValidationSettings(diagnostic=True)),
        ),
        Case(
            "an escalation needs nothing from the agent",
            e(Phase.QUARANTINED, "escalate"),
            with_taint(replace(faulty_node("escalate"), capabilities=None)),
            Phase.ESCALATED,
            "ContactSupport",
            (SetNodeLabel,),
        ),
        # Draining
        Case(
            "draining evicts the pod on the failed GPU",
            e(Phase.DRAINING),
            with_taint(faulty_node(allocations=alloc)),
            Phase.DRAINING,
            "Draining",
            (Evict,),
            pods=(on3, pod("other")),
        ),
        Case(
            "draining waits for the retry interval",
            e(Phase.DRAINING, drain_attempt_at=NOW - timedelta(seconds=1)),
            with_taint(faulty_node(allocations=alloc)),
            Phase.DRAINING,
            "Draining",
            (),
            pods=(on3,),
        ),
        Case(
            "draining done -> remediating",
            e(Phase.DRAINING),
            with_taint(faulty_node(allocations=alloc)),
            Phase.REMEDIATING,
            "Drained",
            pods=(pod("other"),),
        ),
        Case(
            "draining never-mode namespace waits",
            e(Phase.DRAINING),
            with_taint(faulty_node(allocations=alloc)),
            Phase.DRAINING,
            "Draining",
            (),
            pods=(on3,),
            cfg=settings(
                drain=DrainSettings(rules=(DrainRule(namespaces=("work",), mode="never"),))
            ),
        ),
        Case(
            "draining timeout -> escalated",
            e(Phase.DRAINING),
            with_taint(faulty_node(allocations=alloc)),
            Phase.ESCALATED,
            "DrainTimeout",
            (SetNodeLabel,),
            pods=(on3,),
            now=T0 + timedelta(hours=2),
        ),
        Case(
            "draining timeout forces stuck pods where allowed",
            e(Phase.DRAINING),
            with_taint(faulty_node(allocations=alloc)),
            Phase.DRAINING,
            "ForcingStuckPods",
            (ForceDelete,),
            pods=(replace(on3, deletion_timestamp=T0),),
            now=T0 + timedelta(hours=2),
            cfg=settings(
                drain=DrainSettings(
                    on_timeout="force", rules=(DrainRule(namespaces=("work",), force=True),)
                )
            ),
        ),
        Case(
            "draining timeout never forces without the rule",
            e(Phase.DRAINING),
            with_taint(faulty_node(allocations=alloc)),
            Phase.ESCALATED,
            "DrainTimeout",
            (SetNodeLabel,),
            pods=(replace(on3, deletion_timestamp=T0),),
            now=T0 + timedelta(hours=2),
            cfg=settings(drain=DrainSettings(on_timeout="force")),
        ),
        # Remediating: reset
        Case(
            "remediating sends the first reset",
            rem,
            with_taint(ok),
            Phase.REMEDIATING,
            "AwaitingReset",
            (SendOrder,),
        ),
        Case(
            "reset succeeded -> validating",
            e(Phase.REMEDIATING, order=order(rem, "reset-gpu-1")),
            with_taint(ok),
            Phase.VALIDATING,
            "Remediated",
            report=lambda ep: report(ep, "reset-gpu-1", "succeeded"),
        ),
        Case(
            "reset refused waits to retry",
            e(Phase.REMEDIATING, order=order(rem, "reset-gpu-1")),
            with_taint(ok),
            Phase.REMEDIATING,
            "ResetRetryWait",
            report=lambda ep: report(ep, "reset-gpu-1", "refused", reason="gpu-busy"),
        ),
        Case(
            "reset refused at the last attempt escalates",
            e(Phase.REMEDIATING, order=order(rem, "reset-gpu-2")),
            with_taint(ok),
            Phase.ESCALATED,
            "ResetRefused",
            (SetNodeLabel,),
            report=lambda ep: report(ep, "reset-gpu-2", "refused", reason="gpu-busy"),
        ),
        Case(
            "reset without a report is resent after its timeout",
            e(
                Phase.REMEDIATING,
                order=order(rem, "reset-gpu-1", sent_at=NOW - timedelta(seconds=200)),
            ),
            with_taint(ok),
            Phase.REMEDIATING,
            "AwaitingReset",
            (SendOrder,),
        ),
        Case(
            "reset overall timeout escalates",
            e(Phase.REMEDIATING, order=order(rem, "reset-gpu-1")),
            with_taint(ok),
            Phase.ESCALATED,
            "ResetTimeout",
            (SetNodeLabel,),
            now=T0 + timedelta(hours=1),
        ),
        # Remediating: reboot
        Case(
            "remediating orders the reboot",
            rem_reboot,
            with_taint(faulty_node("reboot")),
            Phase.REMEDIATING,
            "Rebooting",
            (SendOrder,),
        ),
        Case(
            "new boot id -> validating",
            e(Phase.REMEDIATING, "reboot", order=order(rem_reboot, "reboot-1")),
            with_taint(healthy_node(boot_id="boot-2")),
            Phase.VALIDATING,
            "Remediated",
        ),
        Case(
            "reboot refused escalates",
            e(Phase.REMEDIATING, "reboot", order=order(rem_reboot, "reboot-1")),
            with_taint(faulty_node("reboot")),
            Phase.ESCALATED,
            "RebootRefused",
            (SetNodeLabel,),
            report=lambda ep: report(ep, "reboot-1", "refused", reason="no-executor"),
        ),
        Case(
            "reboot boot-id-changed waits for the agent",
            e(Phase.REMEDIATING, "reboot", order=order(rem_reboot, "reboot-1")),
            with_taint(faulty_node("reboot")),
            Phase.REMEDIATING,
            "Rebooting",
            report=lambda ep: report(ep, "reboot-1", "refused", reason="boot-id-changed"),
        ),
        Case(
            "external reboot sends nothing",
            rem_reboot,
            with_taint(faulty_node("reboot")),
            Phase.REMEDIATING,
            "AwaitingExternalReboot",
            cfg=settings(
                reboot=RebootSettings(enabled=True, approval_required=False, executor="external")
            ),
        ),
        # Validating
        Case(
            "validating sends the validation order",
            val,
            with_taint(healthy_node()),
            Phase.VALIDATING,
            "Validating",
            (SendOrder,),
        ),
        Case(
            "validation passed and clean -> returned",
            e(
                Phase.VALIDATING,
                validation=ValidationStatus(started_at=T0),
                order=order(val, "validate-1"),
            ),
            with_taint(healthy_node()),
            Phase.RETURNED,
            "Validated",
            report=lambda ep: report(ep, "validate-1", "succeeded"),
        ),
        Case(
            "agent passed but the signal is still there waits",
            e(
                Phase.VALIDATING,
                validation=ValidationStatus(started_at=T0),
                order=order(val, "validate-1"),
            ),
            with_taint(ok),
            Phase.VALIDATING,
            "Validating",
            report=lambda ep: report(ep, "validate-1", "succeeded"),
        ),
        Case(
            "validation failed -> escalated",
            e(
                Phase.VALIDATING,
                validation=ValidationStatus(started_at=T0),
                order=order(val, "validate-1"),
            ),
            with_taint(healthy_node()),
            Phase.ESCALATED,
            "ValidationFailed",
            (SetNodeLabel,),
            report=lambda ep: report(ep, "validate-1", "failed", reason="validation-failed"),
        ),
        Case(
            "validation timeout -> escalated",
            val,
            with_taint(healthy_node()),
            Phase.ESCALATED,
            "ValidationTimeout",
            (SetNodeLabel,),
            now=T0 + timedelta(hours=2),
        ),
        Case(
            "validation pod is created",
            val,
            with_taint(healthy_node()),
            Phase.VALIDATING,
            "Validating",
            (SendOrder, CreateValidationPod),
            cfg=settings(
                validation=ValidationSettings(
                    soak_s=0, pod=ValidationPodSettings(namespace="v", spec={})
                )
            ),
        ),
        # finished
        Case(
            "returned waits for the taint to go",
            e(Phase.RETURNED),
            with_taint(healthy_node()),
            Phase.RETURNED,
            "",
            (),
        ),
        Case(
            "an escalation for no executor never gets an RMA label",
            e(Phase.ESCALATED, reason="NoExecutor"),
            ok,
            Phase.ESCALATED,
            "NoExecutor",
            (),
        ),
        Case(
            "escalated keeps the RMA label",
            e(Phase.ESCALATED, reason="DrainTimeout"),
            with_taint(ok),
            Phase.ESCALATED,
            "DrainTimeout",
            (SetNodeLabel,),
        ),
        Case(
            "released escalation -> validating",
            e(Phase.ESCALATED, reason="DrainTimeout", annotations={KEYS.release_annotation: "me"}),
            with_taint(ok),
            Phase.VALIDATING,
            "Released",
        ),
        # An operator took the quarantine away: the episode ends, nothing disruptive after
        Case(
            "quarantine removed by hand while draining -> failed",
            e(Phase.DRAINING),
            faulty_node(allocations=alloc),
            Phase.FAILED,
            "QuarantineRemoved",
            pods=(on3,),
        ),
        Case(
            "quarantine removed by hand before the reset -> failed, no order",
            rem,
            ok,
            Phase.FAILED,
            "QuarantineRemoved",
        ),
        Case(
            "quarantine removed by hand while validating cancels the validation",
            e(
                Phase.VALIDATING,
                validation=ValidationStatus(started_at=T0),
                order=order(val, "validate-1", state="running"),
            ),
            healthy_node(),
            Phase.FAILED,
            "QuarantineRemoved",
            (SendOrder,),
        ),
        Case(
            "quarantine removed by hand while a reset is in flight cancels the reset",
            e(Phase.REMEDIATING, order=order(rem, "reset-gpu-1", state="")),
            ok,
            Phase.FAILED,
            "QuarantineRemoved",
            (SendOrder,),
        ),
        Case(
            "an abort while the reboot waits out its delay cancels the reboot",
            e(
                Phase.REMEDIATING,
                "reboot",
                order=order(rem_reboot, "reboot-1", state="accepted"),
                annotations={KEYS.abort_annotation: "wrong node"},
            ),
            with_taint(faulty_node("reboot")),
            Phase.FAILED,
            "Aborted",
            (SendOrder,),
        ),
        Case(
            "an abort after the reset finished cancels nothing",
            e(
                Phase.REMEDIATING,
                order=order(rem, "reset-gpu-1", state="failed"),
                annotations={KEYS.abort_annotation: "me"},
            ),
            with_taint(ok),
            Phase.FAILED,
            "Aborted",
        ),
        Case(
            "quarantine acknowledged as removed while awaiting approval -> failed",
            e(Phase.QUARANTINED, "reboot"),
            replace(
                faulty_node("reboot"),
                acknowledged=frozenset({Taint(KEYS.quarantine_taint, "reboot", "NoSchedule")}),
            ),
            Phase.FAILED,
            "QuarantineRemoved",
            cfg=settings(reboot=RebootSettings(enabled=True, approval_required=True)),
        ),
        Case(
            "an acknowledgement of another episode's quarantine is not this one's",
            e(Phase.QUARANTINED),
            with_taint(
                replace(
                    ok,
                    acknowledged=frozenset(
                        {Taint(KEYS.quarantine_taint, "escalated", "NoSchedule")}
                    ),
                )
            ),
            Phase.DRAINING,
            "Draining",
        ),
        Case(
            "excluded before its quarantine -> failed, the slot freed",
            e(Phase.QUARANTINED),
            faulty_node(labels={KEYS.exclude_label: "true"}),
            Phase.FAILED,
            "Excluded",
        ),
        Case(
            "excluded while remediating -> failed",
            rem,
            with_taint(faulty_node(labels={KEYS.exclude_label: "true"})),
            Phase.FAILED,
            "Excluded",
        ),
        Case(
            "excluded while pending -> failed",
            e(),
            faulty_node(labels={KEYS.exclude_label: "true"}),
            Phase.FAILED,
            "Excluded",
        ),
        Case(
            "an episode given up is not released",
            e(
                Phase.FAILED,
                reason="QuarantineRemoved",
                annotations={KEYS.release_annotation: "me"},
            ),
            ok,
            Phase.FAILED,
            "QuarantineRemoved",
        ),
        # Escalated: the RMA label is decided once
        Case(
            "escalated never rewrites a different RMA value",
            e(Phase.ESCALATED, reason="DrainTimeout"),
            with_taint(replace(ok, labels={KEYS.rma_label: "validation-failed"})),
            Phase.ESCALATED,
            "DrainTimeout",
            (),
        ),
        Case(
            "a handled release does nothing",
            e(
                Phase.ESCALATED,
                reason="DrainTimeout",
                release_handled="me",
                annotations={KEYS.release_annotation: "me"},
            ),
            with_taint(replace(ok, labels={KEYS.rma_label: "drain-timeout"})),
            Phase.ESCALATED,
            "DrainTimeout",
            (),
        ),
    ]


@pytest.mark.parametrize("case", cases(), ids=lambda c: c.name)
def test_transition(case: Case) -> None:
    ep = case.ep
    rep = case.report(ep) if callable(case.report) else case.report
    obs = Observed(
        now=case.now, node=case.node, pods=case.pods, report=rep, admission=case.admission
    )
    result = step(ep, obs, Context(case.cfg, KEYS))
    assert result.status.phase is case.want_phase, (result.status.reason, result.status.message)
    if case.want_reason:
        assert result.status.reason == case.want_reason, result.status.message
    assert tuple(type(a) for a in result.actions) == case.want_actions
    if result.status.phase is not ep.status.phase:
        assert result.transitions == ((ep.status.phase, result.status.phase),)
        assert result.requeue_after_s is not None
    # level-triggered: the same inputs give the same step
    again = step(ep, obs, Context(case.cfg, KEYS))
    assert again == result


def test_order_ids_derive_from_the_status() -> None:
    ep = episode(Phase.REMEDIATING)
    obs = Observed(now=NOW, node=with_taint(faulty_node()))
    first = step(ep, obs, Context(settings(), KEYS))
    (act,) = first.actions
    assert isinstance(act, SendOrder)
    assert isinstance(act.order, ResetGpuOrder) and act.kind == "reset-gpu"
    assert act.order.order_id == f"{ep.spec.fault.fingerprint}-reset-gpu-1"
    assert act.order.gpus == [gpu_uuid(3)] and act.order.episode == ep.name


def test_reboot_order_names_the_boot_it_may_interrupt() -> None:
    ep = episode(Phase.REMEDIATING, "reboot")
    result = step(
        ep, Observed(now=NOW, node=with_taint(faulty_node("reboot"))), Context(settings(), KEYS)
    )
    (act,) = result.actions
    assert isinstance(act, SendOrder) and isinstance(act.order, RebootOrder)
    assert act.order.expected_boot_id == "boot-1"


def test_evictions_remembered_as_waiting_pdb_blocked_stay_listed() -> None:
    blocked = PodRecord(
        namespace="work",
        name="on-gpu3",
        uid="uid-work-on-gpu3",
        reason="pdb-blocked",
        message="budget",
    )
    ep = episode(
        Phase.DRAINING, waiting_pods=[blocked], drain_attempt_at=NOW - timedelta(seconds=1)
    )
    node = with_taint(node_facts(unhealthy={3: FAULTS["reset-gpu"]}, allocations=None))
    result = step(
        ep, Observed(now=NOW, node=node, pods=(pod("on-gpu3"),)), Context(settings(), KEYS)
    )
    assert [p.reason for p in result.status.waiting_pods] == ["pdb-blocked"]


def test_returned_never_removes_the_rma_label_of_another_escalated_episode() -> None:
    """Two episodes of one node (one Returned, one Escalated) agree on the RMA label: the
    Returned one leaves it while the other is escalated, and once it has seen the node
    returned it never touches the label again (no fight, no write loop)."""
    labelled = with_taint(replace(healthy_node(), labels={KEYS.rma_label: "validation-failed"}))
    returned = episode(Phase.RETURNED)
    other = episode(Phase.ESCALATED, reason="ValidationFailed")
    obs = Observed(now=NOW, node=labelled)
    assert step(returned, obs, Context(settings(), KEYS, (other,))).actions == ()
    (unlabel,) = step(returned, obs, Context(settings(), KEYS)).actions
    assert isinstance(unlabel, SetNodeLabel) and unlabel.value is None
    times = msgspec.structs.replace(returned.status.times, returned=T0)
    done = msgspec.structs.replace(
        returned, status=msgspec.structs.replace(returned.status, times=times)
    )
    assert step(done, obs, Context(settings(), KEYS)).actions == ()


def test_an_abort_cancels_the_order_in_flight_until_the_agent_acknowledges() -> None:
    """The cancel replaces the aborted order in the status, is sent again while unanswered
    (for as long as the order could run), and stops once the agent reports on it."""
    rem = episode(Phase.REMEDIATING)
    flying = episode(
        Phase.REMEDIATING,
        order=order(rem, "reset-gpu-1", state="running"),
        annotations={KEYS.abort_annotation: "me"},
    )
    aborted = step(
        flying, Observed(now=NOW, node=with_taint(faulty_node())), Context(settings(), KEYS)
    )
    (act,) = aborted.actions
    assert isinstance(act, SendOrder) and isinstance(act.order, CancelOrder)
    target = f"{rem.spec.fault.fingerprint}-reset-gpu-1"
    assert act.order.cancel_order_id == target and act.order.order_id == f"{target}-cancel"
    st = aborted.status
    assert st.order is not None and st.order.action == "cancel"
    failed = msgspec.structs.replace(flying, status=st)
    later = NOW + timedelta(seconds=30)
    unanswered = step(
        failed, Observed(now=later, node=with_taint(ok_node())), Context(settings(), KEYS)
    )
    assert [type(a.order) for a in unanswered.actions if isinstance(a, SendOrder)] == [CancelOrder]
    assert unanswered.requeue_after_s is not None
    ack = ActionReport(
        seq=9,
        node="node-a",
        order_id=f"{target}-cancel",
        episode=flying.name,
        action="cancel",
        state="succeeded",
        at=later,
    )
    answered = step(
        failed,
        Observed(now=later, node=with_taint(ok_node()), report=ack),
        Context(settings(), KEYS),
    )
    assert answered.actions == () and answered.status.order is not None
    assert answered.status.order.state == "succeeded"
    too_late = NOW + timedelta(hours=2)
    assert (
        step(failed, Observed(now=too_late, node=ok_node()), Context(settings(), KEYS)).actions
        == ()
    )


def ok_node() -> NodeFacts:
    return faulty_node()


def test_a_long_release_value_releases_once() -> None:
    """A release annotation longer than the status field: acted on once, then compared as
    stored (its digest). Before, the stored value was cut and compared whole: the episode
    went Escalated -> Validating -> Escalated without end."""
    value = "ops: " + "replaced the GPU baseboard and reseated every cable; " * 6
    assert len(value) > 253
    ep = episode(
        Phase.ESCALATED, reason="DrainTimeout", annotations={KEYS.release_annotation: value}
    )
    node = with_taint(replace(faulty_node(), labels={KEYS.rma_label: "drain-timeout"}))
    released = step(ep, Observed(now=NOW, node=node), Context(settings(), KEYS))
    assert released.status.phase is Phase.VALIDATING
    assert released.status.release_handled == handled_release(value)
    assert len(released.status.release_handled) <= 253
    # the validation fails again: Escalated, with the same annotation still on the object
    again = msgspec.structs.replace(
        ep,
        status=msgspec.structs.replace(
            released.status, phase=Phase.ESCALATED, reason="ValidationFailed"
        ),
    )
    stays = step(again, Observed(now=NOW, node=node), Context(settings(), KEYS))
    assert stays.status.phase is Phase.ESCALATED and stays.transitions == ()
