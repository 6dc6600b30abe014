"""Validating: the node takes work again only after every check passed.

- the agent's validation order: the GPUs reachable through NVML, none of the signals the
  verdict came from, a clean soak window, and the diagnostic hook when enabled;
- the controller's own view: the GPUs in scope report healthy and carry none of those
  signals; a new unhealthy condition after validation started fails at once;
- optionally a user-provided validation pod (a CUDA/NCCL smoke test) scheduled onto the
  node with a toleration of the quarantine taint; it must succeed.

Any failure escalates; ``timeout_s`` without a verdict escalates too.
"""

from __future__ import annotations

import msgspec

from gpuhealth.controller.remediation.actions import Act, CreateValidationPod, SendOrder
from gpuhealth.controller.remediation.deadlines import deadline, earliest, seconds_until
from gpuhealth.controller.remediation.escalation import escalate
from gpuhealth.controller.remediation.facts import NodeFacts, Observed, ValidationPodFacts
from gpuhealth.controller.remediation.model import Check, Episode, Phase, ValidationStatus, clip
from gpuhealth.controller.remediation.orders import (
    UNNUMBERED,
    absorb_report,
    current_order,
    new_order,
    resend_due,
    resent,
)
from gpuhealth.controller.remediation.status import enter, replace, wait
from gpuhealth.controller.remediation.step import Context, Step
from gpuhealth.protocol.remediation import ValidateOrder

POD_PREFIX = "gpuhealth-validate"


MAX_POD_TRIES = 3
"""Validation pods one attempt may create: a pod of the name whose UID was not recorded is
never trusted and a new name is tried, at most this many times (then ``ValidationPodNotOurs``)."""


def pod_name(ep: Episode, attempt: int, tries: int = 0) -> str:
    base = f"{POD_PREFIX}-{ep.spec.fault.fingerprint}-{attempt}"
    return base if tries == 0 else f"{base}-{tries}"


def validation_pod_step(
    ep: Episode, v: ValidationStatus, pod: ValidationPodFacts | None
) -> tuple[ValidationStatus, list[Act], tuple[str, str] | None]:
    """The validation pod, accepted only by the UID its create call returned
    (``v.pod_uid``): the new validation status, the create to make, and (reason, message)
    when the validation fails. ``pod`` is the pod of ``v.pod_name``, whoever made it.

    - nothing created yet: name it and create it;
    - created, its UID not recorded (the create found the name taken, or the status write
      after it was lost): a pod there is not trusted; another name is created, at most
      :data:`MAX_POD_TRIES` times, then ``ValidationPodNotOurs``;
    - a pod of the name with another UID (ours deleted and the name taken): not ours;
    - ours: Failed fails the validation, Succeeded passes it; gone, a new one is created."""
    if not v.pod_name:
        name = pod_name(ep, v.attempt, v.pod_tries)
        return msgspec.structs.replace(v, pod_name=name), [CreateValidationPod(name, ep.node)], None
    if pod is None and not v.pod_uid:  # the create did not happen (or was not seen): again
        return v, [CreateValidationPod(v.pod_name, ep.node)], None
    if pod is not None and v.pod_uid and pod.uid != v.pod_uid:
        message = (
            f"the pod {v.pod_name} is not the one created for this episode (uid {pod.uid}, "
            f"created {v.pod_uid})"
        )
        return v, [], ("ValidationPodNotOurs", message)
    if pod is None or not v.pod_uid:  # ours is gone, or the one there was never known ours
        tries = v.pod_tries + 1
        if tries >= MAX_POD_TRIES:
            message = (
                f"{MAX_POD_TRIES} validation pod names were taken by pods this episode did not "
                f"create, or its pods vanished (the last: {v.pod_name})"
            )
            return v, [], ("ValidationPodNotOurs", message)
        name = pod_name(ep, v.attempt, tries)
        fresh = msgspec.structs.replace(v, pod_name=name, pod_uid="", pod_tries=tries)
        return fresh, [CreateValidationPod(name, ep.node)], None
    if pod.phase == "Failed":
        return v, [], ("ValidationFailed", f"validation pod {v.pod_name} failed: {pod.message}")
    if pod.phase == "Succeeded":
        return msgspec.structs.replace(v, pod_passed=True), [], None
    return v, [], None


def scope_gpus(ep: Episode, node: NodeFacts) -> set[str]:
    if ep.spec.scope == "gpu":
        return {g.uuid for g in ep.spec.fault.gpus}
    return {g.uuid for g in node.gpus} | {g.uuid for g in ep.spec.fault.gpus}


def unclean(ep: Episode, node: NodeFacts) -> list[str]:
    """What keeps the controller's view from being clean (empty: clean)."""
    if node.reporting != "ok":
        return [f"agent {node.reporting}"]
    signals = {g.code for g in ep.spec.fault.gpus}
    problems = []
    for uuid in sorted(scope_gpus(ep, node)):
        g = node.gpu(uuid)
        if g is None:
            problems.append(f"{uuid} not reported")
        elif g.state != "healthy":
            codes = ",".join(c.code for c in g.conditions) or g.state
            problems.append(f"GPU {g.index} {g.state} ({codes})")
        elif any(c.code in signals for c in g.conditions):
            problems.append(f"GPU {g.index} still reports the verdict's signal")
    return problems


def _new_fault(ep: Episode, node: NodeFacts, v: ValidationStatus) -> str | None:
    started = v.started_at
    if started is None:
        return None
    known = {(f.uuid, f.code, f.since) for f in ep.spec.fault.gpus}
    for g in node.gpus:
        if g.uuid not in scope_gpus(ep, node) or g.state != "unhealthy":
            continue
        for c in g.conditions:
            if (g.uuid, c.code, c.since) in known:
                continue  # the episode's own signal, not a new fault
            if c.severity == "unhealthy" and c.since is not None and c.since >= started:
                return f"GPU {g.index} became unhealthy during validation: {c.code} {c.message}"
    return None


def validating(ep: Episode, node: NodeFacts, obs: Observed, cx: Context) -> Step:
    st, now, vs = ep.status, obs.now, cx.settings.validation
    v = st.validation or ValidationStatus(attempt=1, started_at=now)
    end = deadline(v.started_at, vs.timeout_s, now)
    fault = _new_fault(ep, node, v)
    if fault is not None:
        return escalate(
            replace(st, validation=v), now, "ValidationFailed", fault, node=node.name, cx=cx
        )
    order = absorb_report(current_order(st, "validate"), obs.report)
    report = obs.report
    if order is not None and report is not None and report.order_id == order.id and report.checks:
        checks = [
            Check(name=c.name, passed=c.passed, message=clip(c.message, 256)) for c in report.checks
        ]
        v = msgspec.structs.replace(v, checks=checks)
    if order is not None and order.state in ("failed", "refused"):
        st = replace(st, order=order, validation=v)
        failed = [c.name for c in v.checks if not c.passed]
        why = ": ".join(p for p in (order.reason, order.message) if p)
        message = f"agent validation {order.state}: {why}" + (
            f" (failed: {', '.join(failed)})" if failed else ""
        )
        return escalate(st, now, "ValidationFailed", message, node=node.name, cx=cx)
    if order is not None and order.state == "succeeded":
        v = msgspec.structs.replace(v, agent_passed=True)
    actions: list[Act] = []
    timeout = vs.soak_s + vs.report_grace_s
    if order is None:
        order = new_order(ep.spec.fault.fingerprint, "validate", v.attempt, now)
        due_in: float | None = 0.0
    else:
        due_in = resend_due(order, now, timeout, cx.settings.undelivered_retry_s)
    if due_in == 0.0:
        order = resent(order, now)
        actions.append(
            SendOrder(
                ValidateOrder(
                    seq=UNNUMBERED,
                    order_id=order.id,
                    episode=ep.name,
                    issued_at=now,
                    deadline_s=timeout,
                    gpus=sorted(scope_gpus(ep, node)),
                    signals=sorted({g.code for g in ep.spec.fault.gpus}),
                    soak_s=vs.soak_s,
                    diagnostic=vs.diagnostic or wants_diagnostic(ep),
                )
            )
        )
    if vs.pod is not None:
        v, pod_act, problem = validation_pod_step(ep, v, obs.validation_pod)
        actions += pod_act
        if problem is not None:
            st = replace(st, order=order, validation=v)
            reason, message = problem
            return escalate(st, now, reason, message, node=node.name, cx=cx)
    st = replace(st, order=order, validation=v)
    if now >= end:
        message = f"no passing validation after {vs.timeout_s:g}s"
        return escalate(st, now, "ValidationTimeout", message, node=node.name, cx=cx)
    missing = [] if v.agent_passed else [f"agent validation ({order.state or 'sent'})"]
    if vs.pod is not None and not v.pod_passed:
        missing.append(f"validation pod {v.pod_name}")
    missing += unclean(ep, node)
    if not missing:
        return Step(enter(st, Phase.RETURNED, now, "Validated", "all checks passed", validated=now))
    return Step(
        wait(st, now, "Validating", "waiting for: " + "; ".join(missing)),
        actions=tuple(actions),
        requeue_after_s=earliest(
            due_in or None,
            cx.settings.undelivered_retry_s if actions else None,
            seconds_until(end, now),
        ),
    )


def wants_diagnostic(ep: Episode) -> bool:
    """A fault whose verdict asks for diagnostics (``RUN_DIAGNOSTICS``: a GPU the controller
    blamed for faulting under several jobs, ``gpuhealth.controller.incidents``) is validated with
    the diagnostic hook whatever ``validation.diagnostic`` says."""
    return any(g.action == "RUN_DIAGNOSTICS" for g in ep.spec.fault.gpus)
