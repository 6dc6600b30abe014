"""Gathering an episode's observations through the ports (the only reads a pass makes).

Pods are read only where a decision needs them: while Draining (and for a dry-run's
preview): the node's pods (one field-selected LIST), the members of their gangs and of the
gangs the episode already evicted (one LIST per gang), pods listed as waiting on other
nodes (one GET each), and the PodDisruptionBudgets of the gangs' namespaces.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from gpuhealth.controller.remediation.drain import gangs_in_scope
from gpuhealth.controller.remediation.facts import (
    OPT_OUT_VALUE,
    Admission,
    Observed,
    PdbFacts,
    PodFacts,
    RemediationKeys,
    ValidationPodFacts,
)
from gpuhealth.controller.remediation.model import Episode, Phase
from gpuhealth.controller.remediation.ports import NodeSource, PodSource, ReportSource, unique_pods
from gpuhealth.controller.remediation.safety import (
    admission,
    approval_required,
    capability_gap,
    hold_reason,
)
from gpuhealth.controller.remediation.settings import RemediationSettings


async def observe(
    ep: Episode,
    *,
    now: datetime,
    episodes: Sequence[Episode],
    nodes: NodeSource,
    pods: PodSource,
    reports: ReportSource,
    settings: RemediationSettings,
    keys: RemediationKeys,
) -> Observed:
    node = nodes.node(ep.node)
    if node is None:
        return Observed(now=now, node=None)
    dry = settings.dry_run or ep.spec.dry_run
    on_node: list[PodFacts] = []
    elsewhere: list[PodFacts] = []
    pdbs: list[PdbFacts] = []
    if ep.phase is Phase.DRAINING or (ep.phase is Phase.PENDING and dry):
        on_node = await pods.pods_on_node(ep.node)
        gangs = gangs_in_scope(
            ep.spec, node, on_node, settings.drain, frozen=ep.status.frozen_gangs
        )
        for gang in gangs:
            elsewhere += await pods.gang_members(gang)
        known = {p.uid for p in (*on_node, *elsewhere)}
        for rec in ep.status.waiting_pods:
            if rec.uid and rec.uid not in known:
                pod = await pods.pod(rec.namespace, rec.name)
                if pod is not None and pod.uid == rec.uid:
                    elsewhere.append(pod)
        for namespace in sorted({g.namespace for g in gangs}):
            pdbs += await pods.pdbs(namespace)
    order = ep.status.order
    report = reports.latest(ep.node, order.id) if order is not None else None
    vpod: ValidationPodFacts | None = None
    validation = ep.status.validation
    pod_cfg = settings.validation.pod
    if (
        ep.phase is Phase.VALIDATING
        and pod_cfg is not None
        and validation is not None
        and validation.pod_name
    ):
        vpod = await pods.validation_pod(pod_cfg.namespace, validation.pod_name, ep)
    admit = Admission(allowed=True)
    if ep.phase is Phase.PENDING:
        admit = admission(
            ep,
            episodes,
            gpu_nodes=nodes.gpu_nodes(),
            settings=settings,
            keys=keys,
            held=_held(nodes, settings, keys),
        )
    return Observed(
        now=now,
        node=node,
        pods=tuple(on_node),
        gang_pods=tuple(unique_pods(elsewhere)),
        off_limits=_off_limits({p.node for p in elsewhere} - {ep.node}, nodes, keys),
        pdbs=tuple(pdbs),
        report=report,
        validation_pod=vpod,
        admission=admit,
    )


def _off_limits(names: set[str], nodes: NodeSource, keys: RemediationKeys) -> dict[str, str]:
    """Other nodes of gang members an operator keeps the loop off (opt-out or exclude)."""
    out: dict[str, str] = {}
    for name in sorted(n for n in names if n):
        facts = nodes.node(name)
        labels = facts.labels if facts is not None else {}
        if labels.get(keys.opt_out_label) == OPT_OUT_VALUE:
            out[name] = f"{keys.opt_out_label}={OPT_OUT_VALUE}"
        elif labels.get(keys.exclude_label) == "true":
            out[name] = f"{keys.exclude_label}=true"
    return out


def _held(
    nodes: NodeSource, settings: RemediationSettings, keys: RemediationKeys
) -> Callable[[Episode], bool]:
    def held(ep: Episode) -> bool:
        """Not in the admission queue: an operator's hold, or a reboot not yet approved
        (waiting for an approval takes no one's turn)."""
        node = nodes.node(ep.node)
        if approval_required(ep, settings) and not ep.annotations.get(keys.approve):
            return True
        if node is None or capability_gap(ep, node, settings) is not None:
            return True
        return hold_reason(ep, node, settings, keys) is not None

    return held
