"""Replacing an escalated node (pure): replace as an action, where the node's pool allows it.

EKS replaces a node, AKS reboots then reimages then redeploys one, NVSentinel terminates one.
With ``remediation.replace`` an escalated node of a pool that allows it (``replace.pools``,
opt-in per pool) is replaced:

- ``method: nodeclaim`` (Karpenter): the NodeClaim the Node names in its ownerReferences is
  deleted; Karpenter drains the node (its own disruption rules) and launches another.
- ``method: node`` (cluster-autoscaler, a cloud node lifecycle): the node is cordoned (the
  reconciler's write, listed in ``<prefix>/guards``), drained through the Eviction API like an
  episode's drain but of every pod (PodDisruptionBudgets honoured, gangs whole, the blast-radius
  caps), then the Node is deleted; the autoscaler or the cloud brings a new one.

Either delete is a hard write (``replace-node``: the circuit breaker counts the node, the
fleet's and its pool's budgets), checked again right before it is sent (the replacer reads the
NodeClaim or the Node again: its UID, the NodeClaim's node and pool) and guarded by the UID. The
status says ``Requested`` before the delete is sent (written ahead), so a crash in between sends
it again and never loses track of it. What is recorded, ``status.replacement`` (the method, the
pool, the Node's and NodeClaim's UIDs, the RMA reason) and the fault, stays on the
GPURemediation, which no Node owns: the record outlives the Node. Once the Node is gone (or a
new one has its name) the replacement is ``Completed``: the episode stops holding anything and
no longer counts as an unresolved escalation.

Not replaced, with an Event (``NodeReplacementSkipped``) and ``Skipped``: an escalation that
says nothing of the hardware (``NoExecutor``: the agent cannot act), a node in no pool, a pool
not listed, a node a managed repairer owns (it repairs). Not asked for, with a Warning
(``NodeReplacementFailed``) and ``Failed``, nothing deleted: no NodeClaim among the Node's
owners, a NodeClaim that does not exist or is not the node's, a drain that timed out. A node an
operator keeps the loop off (the opt-out label), a dry run, and a node whose NVLink domain has
an open incident (the gate: ``DomainIncident``) wait.
"""

from __future__ import annotations

from datetime import datetime

import msgspec

from gpuhealth.controller.names import (
    EVENT_NODE_REPLACED,
    EVENT_NODE_REPLACEMENT_FAILED,
    EVENT_NODE_REPLACEMENT_SKIPPED,
    NODECLAIM_API_VERSION,
    NODECLAIM_KIND,
    OPT_OUT_VALUE,
)
from gpuhealth.controller.remediation.actions import Act, ReplaceNode
from gpuhealth.controller.remediation.deadlines import deadline, earliest, seconds_until
from gpuhealth.controller.remediation.draining import (
    evict_round,
    keep_times,
    round_due_in,
    round_plan,
    summary,
)
from gpuhealth.controller.remediation.escalation import NOT_THE_HARDWARE, rma_value
from gpuhealth.controller.remediation.facts import NodeFacts, Observed
from gpuhealth.controller.remediation.managed_repair import repair_owner
from gpuhealth.controller.remediation.model import (
    MAX_LISTED_PODS,
    Episode,
    ReplacementState,
    ReplacementStatus,
    Spec,
    Status,
    clip,
)
from gpuhealth.controller.remediation.status import replace
from gpuhealth.controller.remediation.step import Context, Note, Step

SKIPPED: ReplacementState = "Skipped"
DRAINING: ReplacementState = "Draining"
REQUESTED: ReplacementState = "Requested"
DELETED: ReplacementState = "Deleted"
COMPLETED: ReplacementState = "Completed"
FAILED: ReplacementState = "Failed"
SETTLED = frozenset({SKIPPED, FAILED, COMPLETED})
"""States nothing follows."""
UNDER_WAY = frozenset({DRAINING, REQUESTED, DELETED})


def node_scoped(spec: Spec) -> Spec:
    """The spec a replacement drains with: every pod of the node."""
    return msgspec.structs.replace(spec, scope="node")


def replacing_drain(ep: Episode) -> bool:
    """Is the episode draining its node for a replacement (pods are observed, the node is
    cordoned)?"""
    r = ep.status.replacement
    return r is not None and r.state == DRAINING


def holds_cordon(ep: Episode) -> bool:
    """Does the replacement keep its node cordoned: while it drains, and, for the ``node``
    method, once the delete is requested (written ahead) until the Node is gone — the delete
    checks the cordon right before it acts, so lifting it between the two would refuse it."""
    r = ep.status.replacement
    return r is not None and (r.state == DRAINING or (r.state == REQUESTED and r.method == "node"))


def moved(
    st: Status, r: ReplacementStatus, state: ReplacementState, now: datetime, *why: str
) -> Status:
    """The replacement in ``state`` since ``now``; ``why``: its reason and message."""
    reason, message = why
    return replace(
        st,
        replacement=msgspec.structs.replace(
            r, state=state, reason=reason, message=clip(message), at=now
        ),
    )


def replacement_step(ep: Episode, node: NodeFacts | None, obs: Observed, cx: Context) -> Step:
    """What an Escalated episode does about its node's replacement (its status unchanged and
    no action when nothing)."""
    st, now = ep.status, obs.now
    r = st.replacement
    gone = node is None or (r is not None and bool(r.node_uid) and node.uid not in ("", r.node_uid))
    if r is not None and r.state in UNDER_WAY and gone:
        message = f"the replaced node is gone ({r.method}, pool {r.pool})"
        note = Note("Normal", EVENT_NODE_REPLACED, message)
        return Step(moved(st, r, COMPLETED, now, "Replaced", message), notes=(note,))
    if node is None or gone or (r is not None and r.state in SETTLED):
        return Step(st)
    if r is None:
        return decide(ep, node, obs, cx)
    if r.state == DRAINING:
        return drain(ep, node, r, obs, cx)
    if r.state == REQUESTED:  # written ahead, what the delete did not recorded: send it again
        return Step(st, actions=(request(ep.node, r, again=True),))
    return Step(st, requeue_after_s=cx.settings.resync_s)  # DELETED: waiting for the Node to go


def request(node: str, r: ReplacementStatus, *, again: bool = False) -> ReplaceNode:
    return ReplaceNode(
        node=node,
        node_uid=r.node_uid,
        method="node" if r.method == "node" else "nodeclaim",
        pool=r.pool,
        node_claim=r.node_claim,
        node_claim_uid=r.node_claim_uid,
        again=again,
    )


def decide(ep: Episode, node: NodeFacts, obs: Observed, cx: Context) -> Step:
    """Replace the node, or say why not (once, with an Event)."""
    st, now, rs = ep.status, obs.now, cx.settings.replace
    opted_out = node.labels.get(cx.keys.opt_out_label) == OPT_OUT_VALUE
    if not rs.enabled or opted_out or cx.settings.dry_run or ep.spec.dry_run:
        return Step(st)  # waits: an operator's hold, or a dry run (nothing is changed)
    method = rs.method_for(node.pool)
    base = ReplacementStatus(
        state=SKIPPED,
        method=method or "",
        pool=node.pool,
        node_uid=node.uid,
        rma=node.labels.get(cx.keys.rma_label) or rma_value(st.reason) or "",
        started_at=now,
        at=now,
    )
    owner = repair_owner(node.labels, node.conditions, cx.settings.managed_repair)
    why: tuple[str, str] | None = None
    if st.reason in NOT_THE_HARDWARE:
        why = ("NotTheHardware", f"escalated for {st.reason}, which says nothing of the hardware")
    elif owner is not None:
        why = ("ManagedRepair", f"{owner.owner} owns the repair of this node ({owner.signal})")
    elif not node.pool:
        why = ("NoPool", "the node carries none of the pool labels (fleet.pool_labels)")
    elif method is None:
        why = (
            "PoolNotAllowed",
            f"node pool {node.pool} does not allow replacement (remediation.replace.pools)",
        )
    if why is not None:
        reason, message = why
        message = f"not replaced: {message}; nothing deleted"
        note = Note("Normal", EVENT_NODE_REPLACEMENT_SKIPPED, message, node=True)
        return Step(moved(st, base, SKIPPED, now, reason, message), notes=(note,))
    if method == "node":
        message = "cordoning and draining the node before its Node is deleted"
        return Step(
            moved(st, base, DRAINING, now, "Draining", message),
            requeue_after_s=cx.settings.quarantine_check_s,
        )
    claim = next(
        (o for o in node.owners if (o[0], o[1]) == (NODECLAIM_API_VERSION, NODECLAIM_KIND)), None
    )
    if claim is None:
        return failed(
            st,
            base,
            now,
            "NodeClaimNotFound",
            f"the Node names no {NODECLAIM_KIND} ({NODECLAIM_API_VERSION}) among its owners",
        )
    r = msgspec.structs.replace(base, node_claim=claim[2], node_claim_uid=claim[3])
    message = (
        f"deleting {NODECLAIM_KIND} {claim[2]}: Karpenter drains the node and launches another"
    )
    return Step(moved(st, r, REQUESTED, now, "Requested", message), actions=(request(ep.node, r),))


def failed(st: Status, r: ReplacementStatus, now: datetime, reason: str, message: str) -> Step:
    message = f"not replaced: {message}; nothing deleted"
    note = Note("Warning", EVENT_NODE_REPLACEMENT_FAILED, message, node=True)
    return Step(moved(st, r, FAILED, now, reason, message), notes=(note,))


def drain(ep: Episode, node: NodeFacts, r: ReplacementStatus, obs: Observed, cx: Context) -> Step:
    """``method: node``: once the reconciler cordoned the node, evict every pod in rounds (the
    drain's rules and caps), then delete the Node; ``replace.drain_timeout_s`` fails it."""
    st, now, ds = ep.status, obs.now, cx.settings.drain
    started = r.started_at or now
    end = deadline(started, cx.settings.replace.drain_timeout_s, now)
    if not node.unschedulable:
        if now >= end:
            return failed(st, r, now, "DrainTimeout", "the node was never cordoned")
        return Step(st, requeue_after_s=cx.settings.quarantine_check_s)
    plan = round_plan(node_scoped(ep.spec), node, st, obs, cx, started=started)
    if plan.done:
        st = replace(st, waiting_pods=[], waiting_count=0)
        message = "drained; deleting the Node: its node group or cloud brings a new one"
        return Step(
            moved(st, r, REQUESTED, now, "Requested", message), actions=(request(ep.node, r),)
        )
    if now >= end:
        return failed(
            st,
            r,
            now,
            "DrainTimeout",
            f"drain not done after {cx.settings.replace.drain_timeout_s:g}s: {summary(plan)}",
        )
    if plan.over_cap:
        return failed(st, r, now, "BlastRadiusCap", plan.over_cap)
    listed = keep_times(plan.waiting[:MAX_LISTED_PODS], st.waiting_pods)
    st = replace(st, waiting_pods=listed, waiting_count=len(plan.waiting))
    due_in = round_due_in(st, now, ds.retry_s)
    actions: tuple[Act, ...] = ()
    if plan.evict and due_in == 0.0:
        st, actions = evict_round(st, plan, node.name, now)
        due_in = ds.retry_s
    st = moved(st, r, DRAINING, r.at or now, "Draining", summary(plan))
    return Step(
        st,
        actions=actions,
        requeue_after_s=earliest(
            due_in or ds.retry_s, seconds_until(plan.next_change, now), seconds_until(end, now)
        ),
    )
