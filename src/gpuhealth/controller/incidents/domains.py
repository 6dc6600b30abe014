"""NVLink domains: which nodes share a fabric, and when their faults are the fabric's (pure).

A multi-node NVLink system (GB200/GB300 NVL72) is one fabric per rack: its compute trays'
GPUs register with the same cluster UUID and clique id. A node's domain is what its agent
reports (the GPUs' fabric membership, ``<clusterUUID>.<cliqueId>``), else GPU feature
discovery's ``nvidia.com/gpu.clique`` label (the same form). A node is *faulty* while its agent
reports a fabric or NVLink fault: a fabric verdict (``fabric-not-ready``, ``fabric-degraded``),
a fatal NVSwitch error (``nvswitch-fatal``), an NVLink XID (74, 144-150) or an unhealthy
condition scoped to the NVLink domain (``Condition.scope`` ``nvlink-domain``), the fault dated
by when the agent first saw it. A degraded condition never counts by its scope alone: that is
every preview-only signal (a GPU Operational Event without a legacy Xid, which the agent never
judges above degraded), and a preview field must not taint a rack.

:func:`judge_domains` decides per domain: an incident when the faults of at least
``min_nodes`` nodes first appeared within ``window_s`` of each other (a bad switch tray or
fabric shows on many trays at once; one tray's own fault stays that node's), and, once open,
until every node that faulted while it was open reports again, fresh, with a healthy fabric:
positive evidence only. A member that faulted and is silent, disconnected or not reconnected
yet (a new leader before the agents came back) keeps it open; so does any member reporting a
fault. What follows from an incident (the taint on every node of the domain, the breaker
admitting or holding the domain whole, no GPU resets) is
:mod:`gpuhealth.controller.incidents.domain_monitor`; an operator's resolve closes it there.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from gpuhealth.controller.fleet.health import NVLINK_DOMAIN_SCOPE
from gpuhealth.controller.incidents.domain_settings import DomainSettings
from gpuhealth.protocol import Condition

_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


@dataclass(frozen=True, slots=True)
class NodeFabric:
    """One node as the domain judge reads it."""

    name: str
    domain: str | None
    fault_since: datetime | None = None
    """When the agent first saw the node's oldest current fabric/NVLink fault; None: none."""
    fault: str = ""
    """That fault's code (``fabric-degraded``, ``xid-149`` ...)."""
    reporting: bool = True
    """Its agent reports now (connected, a Snapshot since this controller started, not
    silent): what it says of its fabric is fresh."""


@dataclass(frozen=True, slots=True)
class DomainVerdict:
    domain: str
    nodes: tuple[str, ...]
    """Every node of the domain, sorted."""
    faulty: tuple[str, ...]
    """The nodes reporting a fabric or NVLink fault now, sorted."""
    incident: bool
    reason: str = ""
    faults: tuple[str, ...] = ()
    """The fault codes seen, sorted, deduplicated."""
    faulted: tuple[str, ...] = ()
    """The nodes that faulted while the incident was open (those faulty now included),
    sorted: each must report a healthy fabric before it closes."""
    waiting: tuple[str, ...] = ()
    """Of those, the nodes whose agent does not report now (silent, disconnected, not back
    after a controller start): they keep it open."""


def valid_domain(value: str | None) -> str | None:
    """A domain id usable as a taint value (a label value: at most 63 characters of
    ``[-A-Za-z0-9_.]``); None for anything else (a malformed label is ignored)."""
    if not value or not _LABEL_VALUE.match(value):
        return None
    return value


def node_domain(gpu_domains: Iterable[str | None], label: str | None) -> str | None:
    """The node's domain: the one most of its GPUs report, else its clique label."""
    counts = Counter(d for d in gpu_domains if d)
    if counts:
        return valid_domain(counts.most_common(1)[0][0])
    return valid_domain(label)


def is_fabric_fault(c: Condition, settings: DomainSettings) -> bool:
    """Does this condition count as a fabric or NVLink fault (by code, XID, or scope when it
    is unhealthy: a preview-only, degraded signal never opens a domain incident)?"""
    return (
        c.code in settings.fault_codes
        or (c.xid is not None and c.xid in settings.fault_xids)
        or (c.scope == NVLINK_DOMAIN_SCOPE and c.severity == "unhealthy")
    )


def fabric_fault(
    gpu_conditions: Iterable[Condition],
    node_conditions: Iterable[Condition],
    settings: DomainSettings,
    now: datetime,
    *,
    after: datetime | None = None,
) -> tuple[datetime | None, str]:
    """The node's oldest current fabric or NVLink fault: (first seen, code); (None, "") when
    there is none. A condition without ``since`` counts as first seen ``now``; one first seen
    at or before ``after`` (an operator resolved the domain's incident then) does not count."""
    best: tuple[datetime, str] | None = None
    for c in (*gpu_conditions, *node_conditions):
        if not is_fabric_fault(c, settings):
            continue
        t = c.since or now
        if after is not None and t <= after:
            continue
        if best is None or t < best[0]:
            best = (t, c.code)
    return best if best is not None else (None, "")


def _in_one_window(times: list[datetime], window_s: float, need: int) -> bool:
    """Do ``need`` of ``times`` (sorted) lie within ``window_s`` of each other?"""
    if need <= 1:
        return bool(times)
    for i in range(len(times) - need + 1):
        if (times[i + need - 1] - times[i]).total_seconds() <= window_s:
            return True
    return False


def judge_domains(
    nodes: Iterable[NodeFabric],
    open_domains: Mapping[str, Collection[str]],
    settings: DomainSettings,
) -> list[DomainVerdict]:
    """Every domain with a node, sorted by id: whether it has an incident now.
    ``open_domains``: the domains whose incident is open, each with the nodes that faulted
    while it was open (it stays open while any node of it is faulty, or any of those does not
    report)."""
    members: dict[str, list[NodeFabric]] = {}
    for n in nodes:
        if n.domain is not None:
            members.setdefault(n.domain, []).append(n)
    out: list[DomainVerdict] = []
    for domain in sorted(members):
        group = sorted(members[domain], key=lambda n: n.name)
        faulty = [n for n in group if n.fault_since is not None]
        names = tuple(n.name for n in group)
        bad = tuple(n.name for n in faulty)
        codes = tuple(sorted({n.fault for n in faulty if n.fault}))
        times = sorted(n.fault_since for n in faulty if n.fault_since is not None)
        already = domain in open_domains
        faulted: tuple[str, ...] = ()
        waiting: tuple[str, ...] = ()
        if already:
            before = set(open_domains[domain]) | set(bad)
            faulted = tuple(n for n in names if n in before)
            waiting = tuple(n.name for n in group if n.name in before and not n.reporting)
            incident = bool(faulty) or bool(waiting)
        else:
            incident = settings.enabled and _in_one_window(
                times, settings.window_s, settings.min_nodes
            )
            faulted = bad if incident else ()
        reason = ""
        if incident and faulty:
            reason = (
                f"fabric or NVLink faults ({', '.join(codes)}) on {len(bad)} of {len(names)} "
                f"nodes of NVLink domain {domain}"
                + ("" if already else f", first seen within {settings.window_s:g}s")
            )
        elif incident:
            reason = (
                f"{len(waiting)} of {len(names)} nodes of NVLink domain {domain} that faulted "
                "have not reported a healthy fabric since"
            )
        out.append(DomainVerdict(domain, names, bad, incident, reason, codes, faulted, waiting))
    return out
