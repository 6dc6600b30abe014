"""Folding what the API server shows into verdicts on the demo's checks (pure).

The demo polls Nodes (taints) and the workload pods (idle annotation, ``GPUIdle`` Events)
and feeds each poll to :class:`Observations`; :func:`evaluate` says, per check, whether it
passed, failed for good, or is still pending (pending at the end is a failure).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from demo.plan import PREFIX, WORKLOAD_NAMESPACE, Check

Status = Literal["pass", "fail", "pending", "holding"]
"""``holding``: a "never" check that has held so far (it passes if it still holds at the end)."""
TaintId = tuple[str, str, str]
"""(key, value, effect)."""


@dataclass
class Observations:
    polls: int = 0
    current: dict[str, set[TaintId]] = field(default_factory=dict)
    """Node -> our taints at the last poll."""
    ever: dict[str, set[TaintId]] = field(default_factory=dict)
    removed: dict[str, set[TaintId]] = field(default_factory=dict)
    """Taints seen on a node and gone at a later poll."""
    idle_pods: set[str] = field(default_factory=set)
    """Pods flagged idle at any poll (annotation or GPUIdle Event)."""
    xids: dict[str, set[int]] = field(default_factory=dict)
    """Node -> XIDs its agent counted (``gpuhealth_gpu_xid_errors_total``)."""
    remediated: set[str] = field(default_factory=set)
    """Nodes with a remediation episode that reached Returned through every stage."""
    incidents: dict[str, Mapping[str, object]] = field(default_factory=dict)
    """Fleet-level incidents the controller listed (``/api/v1/fleet``), by id."""
    guarded: set[str] = field(default_factory=set)
    """Nodes seen with ``karpenter.sh/do-not-disrupt: "true"`` (gpuhealth holds them)."""
    replaced: set[str] = field(default_factory=set)
    """Nodes whose escalated episode's replacement completed (the Node gone, the record kept)."""

    def observe_nodes(self, taints: Mapping[str, Iterable[Mapping[str, object]]]) -> None:
        """One poll: node name -> its taints as the API returns them."""
        self.polls += 1
        for node, raw in taints.items():
            now = {
                (str(t.get("key")), str(t.get("value") or ""), str(t.get("effect")))
                for t in raw
                if str(t.get("key", "")).startswith(PREFIX + "/")
            }
            before = self.current.get(node, set())
            self.removed.setdefault(node, set()).update(before - now)
            self.ever.setdefault(node, set()).update(now)
            self.current[node] = now

    def observe_node(self, node: str, raw: Iterable[Mapping[str, object]]) -> None:
        """One node's taints from the node watch (between polls)."""
        polls = self.polls
        self.observe_nodes({node: raw})
        self.polls = polls

    def observe_idle(self, pods: Iterable[str]) -> None:
        self.idle_pods.update(pods)

    def observe_xids(self, node: str, xids: Iterable[int]) -> None:
        self.xids.setdefault(node, set()).update(xids)

    def observe_incidents(self, incidents: Iterable[Mapping[str, object]]) -> list[str]:
        """The open incidents of one poll; one line for each not seen before."""
        lines = []
        for i in incidents:
            iid = str(i.get("id"))
            if iid not in self.incidents:
                lines.append(f"incident: {i.get('kind')} -> {i.get('decision')}: {i.get('reason')}")
            self.incidents[iid] = i
        return lines


def _job_incident(check: Check, obs: Observations) -> bool:
    owner = f"{WORKLOAD_NAMESPACE}/Job/{check.job}"
    for i in obs.incidents.values():
        subjects = i.get("subjects")
        if (
            i.get("kind") == "job"
            and i.get("decision") == "no taint"
            and isinstance(subjects, Mapping)
            and subjects.get("owner") == owner
            and (not check.rail or check.rail in (subjects.get("rails") or ()))
        ):
            return True
    return False


def _incident_on(kind: str, node: str, obs: Observations, decision: str = "") -> bool:
    for i in obs.incidents.values():
        subjects = i.get("subjects")
        nodes = subjects.get("nodes") if isinstance(subjects, Mapping) else None
        if (
            i.get("kind") == kind
            and isinstance(nodes, list)
            and node in nodes
            and str(i.get("decision", "")).startswith(decision)
        ):
            return True
    return False


def _has(taints: Iterable[TaintId], key: str, effect: str) -> bool:
    return any(k == key and e == effect for k, _v, e in taints)


def evaluate(check: Check, obs: Observations) -> Status:
    node = check.node
    if check.kind == "tainted":
        return "pass" if _has(obs.ever.get(node, ()), check.taint_key, check.effect) else "pending"
    if check.kind == "untainted_after":
        gone = _has(obs.removed.get(node, ()), check.taint_key, check.effect)
        back = _has(obs.current.get(node, ()), check.taint_key, check.effect)
        return "pass" if gone and not back else "pending"
    if check.kind == "never_tainted":  # with an effect: never a taint of that effect
        if any(not check.effect or e == check.effect for _k, _v, e in obs.ever.get(node, ())):
            return "fail"
        return "holding" if obs.polls else "pending"
    if check.kind == "idle":
        return "pass" if check.pod in obs.idle_pods else "pending"
    if check.kind == "not_idle":
        return "fail" if check.pod in obs.idle_pods else "holding"
    if check.kind == "remediated":
        return "pass" if node in obs.remediated else "pending"
    if check.kind == "job_incident":
        return "pass" if _job_incident(check, obs) else "pending"
    if check.kind == "gpu_blamed":
        return "pass" if _incident_on("gpu", node, obs, "gpu blamed") else "pending"
    if check.kind == "unwatched":
        return "pass" if _incident_on("unwatched", node, obs) else "pending"
    if check.kind == "replaced":
        return "pass" if node in obs.replaced and node in obs.guarded else "pending"
    if check.kind == "xid_seen":
        return "pass" if check.xid in obs.xids.get(node, set()) else "pending"
    raise ValueError(f"unknown check kind {check.kind!r}")


def settled(checks: Iterable[Check], obs: Observations) -> bool:
    """Every positive check passed and every "never" check holds so far."""
    return all(evaluate(c, obs) in ("pass", "holding") for c in checks)


def final(checks: Iterable[Check], obs: Observations) -> list[tuple[Check, bool]]:
    """At the end a check that still holds passes, and a pending one has failed."""
    return [(c, evaluate(c, obs) in ("pass", "holding")) for c in checks]


def describe_taints(taints: Iterable[TaintId]) -> str:
    return ", ".join(f"{k}={v}:{e}" for k, v, e in sorted(taints)) or "-"
