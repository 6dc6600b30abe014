"""``gpuhealth-controller status [--url URL] [--ca-file CA] [--kubeconfig FILE]``: the fleet
as a table, for people and scripts.

Reads ``GET /api/v1/fleet`` from a running controller (page by page, following its
``continue`` tokens, gzip-compressed) with the bearer token of the kubeconfig's user (reads
are authorized by default, ``http.auth.reads``: ``get fleet.gpuhealth.io`` in the
controller's namespace, the chart's ``<fullname>-controller-viewer`` ClusterRole, as
``breaker`` does through :mod:`gpuhealth.controller.http.client`) and prints one row per node,
the unhealthy ones first, with their gpuhealth taints, the NIC ports (rails) with a verdict
and the GPUs behind each, and, per broken GPU, the reason and the action NVIDIA recommends;
with remediation on, then the episode pipeline (episodes per phase) and one row per episode
(node, phase, action, reason, time in the phase, age, pods evicted); then the open
fleet-level incidents (job, with the rails it crashed on; GPU, NVLink domain, unwatched node,
a taint removed by hand) with what was decided and why, and on-call's part (acknowledged by,
silenced until, resolved by; "paging" when none). Past one process any replica answers for
the whole fleet (:mod:`gpuhealth.controller.shards.reads`); a shard it could not read is named
after the table. Exit status: 0 when no node is unhealthy, 1 when any node is unhealthy, 3
when the controller could not be asked, 4 when no node read is unhealthy but a shard could not
be read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from gpuhealth.common.errors import ConfigError, TransientError
from gpuhealth.controller.fleet.health import RAIL_SCOPE
from gpuhealth.controller.http.access import FLEET_RESOURCE
from gpuhealth.controller.http.api import FLEET_PATH
from gpuhealth.controller.http.client import (
    DEFAULT_URL,
    REQUEST_TIMEOUT_S,
    ControllerClient,
    ControllerUnreachable,
    plain_http_off_host,
)
from gpuhealth.controller.kube.client import kubeconfig_token
from gpuhealth.controller.names import API_GROUP, REASON_AGENT_MISSING
from gpuhealth.controller.remediation.summary import table as episode_table
from gpuhealth.protocol import HEALTH_STATES, severity

PAGE_LIMIT = 1000
"""Nodes asked for per request; the command follows the answer's ``continue`` token until the
last page (a controller without pages answers the whole fleet at once)."""
MAX_PAGES = 1000
"""Pages followed at most (a controller answering the same token forever is refused)."""
EXIT_OK = 0
EXIT_UNHEALTHY = 1
EXIT_UNREACHABLE = 3
EXIT_INCOMPLETE = 4

HEADERS = ("NODE", "STATE", "HEALTHY", "TAINTS", "REASONS (ACTION)")
READ_HINT = (
    " (the command sends your kubeconfig's bearer token; reading needs get on "
    f"{FLEET_RESOURCE}.{API_GROUP} in the controller's namespace: the chart's "
    "<fullname>-controller-viewer ClusterRole)"
)


class FleetUnavailable(TransientError):
    """The controller did not answer with the fleet JSON."""


def fetch_fleet(
    url: str,
    timeout_s: float = REQUEST_TIMEOUT_S,
    ca_file: str | None = None,
    *,
    page_limit: int = PAGE_LIMIT,
    token: str | None = None,
) -> dict[str, Any]:
    """The whole fleet, page by page (``limit`` and ``continue``), gzip-compressed, with
    ``token`` as the bearer token when given."""
    client = ControllerClient(url, token=token, ca_file=ca_file, timeout_s=timeout_s)
    nodes: list[Any] = []
    unavailable: dict[int, str] = {}
    page: str | None = None
    doc: dict[str, Any] = {}
    for _ in range(MAX_PAGES):
        query = {"limit": str(page_limit), **({"continue": page} if page else {})}
        target = client.url(FLEET_PATH, query)
        try:
            answer = client.request("GET", FLEET_PATH, query)
        except ControllerUnreachable as exc:
            raise FleetUnavailable(f"cannot read the fleet: {exc}") from exc
        if not answer.ok:
            message = answer.body.get("message") or answer.body.get("error") or ""
            hint = READ_HINT if answer.status in (401, 403) else ""
            raise FleetUnavailable(f"cannot read {target}: HTTP {answer.status} {message}{hint}")
        doc = checked(answer.body, target)
        nodes.extend(doc["nodes"])
        unavailable.update(unavailable_shards(doc))
        page = doc.get("continue") if isinstance(doc.get("continue"), str) else None
        if not page:
            if "shards" not in doc:
                return {**doc, "nodes": nodes, "continue": None}
            missing = [{"shard": i, "reason": why} for i, why in sorted(unavailable.items())]
            shards = {**doc["shards"], "unavailable": missing}
            return {**doc, "nodes": nodes, "continue": None, "shards": shards}
    raise FleetUnavailable(f"{client.url(FLEET_PATH)}: more than {MAX_PAGES} pages")


def unavailable_shards(doc: Mapping[str, Any]) -> dict[int, str]:
    """Past one process: the shards a page says it could not read, with why."""
    shards = doc.get("shards")
    found = shards.get("unavailable") if isinstance(shards, Mapping) else None
    return {
        u["shard"]: str(u.get("reason", ""))
        for u in _list(found)
        if isinstance(u, Mapping) and isinstance(u.get("shard"), int)
    }


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def checked(data: object, where: str) -> dict[str, Any]:
    """The fleet document with malformed entries dropped; FleetUnavailable if it is none."""
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        raise FleetUnavailable(f"{where}: not a fleet document (no 'nodes' list)")
    nodes = []
    for n in data["nodes"]:
        if not isinstance(n, dict):
            continue
        gpus = [
            {**g, "conditions": [c for c in g.get("conditions") or [] if isinstance(c, dict)]}
            for g in _list(n.get("gpus"))
            if isinstance(g, dict) and isinstance(g.get("conditions") or [], list)
        ]
        taints = [t for t in _list(n.get("taints")) if isinstance(t, dict | str)]
        nodes.append({**n, "gpus": gpus, "taints": taints})
    return {**data, "nodes": nodes}


def _taint(t: Mapping[str, Any] | str) -> str:
    if isinstance(t, str):
        return t
    return f"{t.get('key', '')}={t.get('value') or ''}:{t.get('effect', '')}"


def gpu_reasons(gpu: Mapping[str, Any]) -> str:
    """``GPU 3 xid-79 GPU has fallen off the bus (RESTART_BM)`` for a GPU that is not healthy
    (its rail's conditions are the node's rails' row, :func:`rail_reasons`)."""
    conds = [c for c in gpu.get("conditions") or [] if c.get("scope") != RAIL_SCOPE]
    if not conds:
        return f"GPU {gpu.get('index')} {gpu.get('state')}"
    parts = []
    for c in conds:
        text = str(c.get("code") or c.get("reason") or "?")
        if c.get("message"):
            text += f" {c['message']}".rstrip(".")
        if c.get("action") and c.get("action") != "NONE":
            text += f" ({c['action']})"
        parts.append(text)
    return f"GPU {gpu.get('index')} " + "; ".join(parts)


def rail_reasons(node: Mapping[str, Any]) -> list[str]:
    """``rail mlx5_2/1 rail-flapping, 4 flap(s) (GPUs 4, 5, 6, 7)`` for each port with a
    verdict (the GPUs behind it by index)."""
    index = {g.get("uuid"): g.get("index") for g in node.get("gpus") or []}
    out = []
    for p in _list(node.get("nics")):
        if not isinstance(p, Mapping) or not p.get("verdicts"):
            continue
        behind = [str(index[u]) for u in _list(p.get("gpus")) if u in index]
        text = f"rail {p.get('device')}/{p.get('port')} " + ", ".join(map(str, p["verdicts"]))
        if p.get("flaps"):
            text += f", {p['flaps']} flap(s)"
        out.append(text + (f" (GPUs {', '.join(behind)})" if behind else ""))
    return out


def _own_conditions(gpu: Mapping[str, Any]) -> bool:
    conds = gpu.get("conditions") or []
    return not conds or any(c.get("scope") != RAIL_SCOPE for c in conds)


def node_row(node: Mapping[str, Any]) -> tuple[str, ...]:
    gpus: list[Mapping[str, Any]] = list(node.get("gpus") or [])
    healthy = sum(1 for g in gpus if g.get("state") == "healthy")
    state = str(node.get("state", "unknown"))
    condition = node.get("condition")
    if node.get("silent"):
        state += " (agent silent)"
    elif isinstance(condition, Mapping) and condition.get("reason") == REASON_AGENT_MISSING:
        state += " (no agent)"
    elif not node.get("connected", True):
        state += " (agent not connected)"
    reasons = rail_reasons(node) + [
        gpu_reasons(g) for g in gpus if g.get("state") != "healthy" and _own_conditions(g)
    ]
    return (
        str(node.get("name", "?")),
        state,
        f"{healthy}/{len(gpus)}" if gpus else "-",
        ", ".join(_taint(t) for t in node.get("taints") or []) or "-",
        "; ".join(reasons) or "-",
    )


def sort_nodes(nodes: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Worst first (unhealthy, unknown, degraded, healthy: ``gpuhealth.protocol.HEALTH_STATES``
    reversed); by name within a state."""
    return sorted(nodes, key=lambda n: (-severity(str(n.get("state"))), str(n.get("name"))))


def render_table(fleet: Mapping[str, Any]) -> str:
    rows = [HEADERS, *(node_row(n) for n in sort_nodes(fleet.get("nodes") or []))]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADERS) - 1)]
    lines = [
        "  ".join([*(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)), r[-1]]).rstrip()
        for r in rows
    ]
    lines.append(summary_line(fleet))
    lines.extend(
        f"INCOMPLETE: shard {i} not read: {why}" for i, why in unavailable_shards(fleet).items()
    )
    remediation = fleet.get("remediation")
    if isinstance(remediation, Mapping):
        lines.extend(["", *remediation_lines(remediation)])
    incidents = [i for i in _list(fleet.get("incidents")) if isinstance(i, Mapping)]
    if incidents:
        lines.extend(["", *incident_lines(incidents)])
    return "\n".join(lines)


INCIDENT_HEADERS = ("ID", "KIND", "SUBJECT", "DECISION", "SINCE", "ON-CALL", "WHY")


def on_call(i: Mapping[str, Any]) -> str:
    """On-call's part of an incident: who acknowledged, silenced (until when) or resolved it;
    ``paging`` for an open incident nobody took; ``closed`` otherwise."""
    lifecycle = i.get("lifecycle")
    lifecycle = lifecycle if isinstance(lifecycle, Mapping) else {}
    words = []
    for name, verb in (("resolved", "resolved"), ("silenced", "silenced"), ("acknowledged", "ack")):
        act = lifecycle.get(name)
        if not isinstance(act, Mapping) or not act.get("applied"):
            continue
        text = f"{verb} by {act.get('by', '?')}"
        if name == "silenced":
            text += f" until {act.get('until', '?')}"
        words.append(text)
    if words:
        return "; ".join(words)
    return str(i.get("paging") or ("closed" if i.get("state") == "closed" else "paging"))


def _subject(i: Mapping[str, Any]) -> str:
    subjects = i.get("subjects")
    subjects = subjects if isinstance(subjects, Mapping) else {}
    nodes = [str(n) for n in _list(subjects.get("nodes"))]
    gpus = [str(g) for g in _list(subjects.get("gpus"))]
    rails = [str(r) for r in _list(subjects.get("rails"))]
    if subjects.get("owner"):
        on = f"; rail {', '.join(rails)}" if rails else ""
        return f"{subjects['owner']} ({len(nodes)} nodes{on})"
    if subjects.get("domain"):
        return f"domain {subjects['domain']} ({len(nodes)} nodes)"
    if i.get("kind") == "gpu" and gpus:
        return gpus[0]
    return ", ".join(nodes[:3]) + (f" +{len(nodes) - 3}" if len(nodes) > 3 else "") or "-"


def incident_lines(incidents: Sequence[Mapping[str, Any]]) -> list[str]:
    """The incidents: one row each (which, what, about whom, what was decided, since,
    on-call's part, why: the close reason of a closed one)."""
    by_kind: dict[str, int] = {}
    for i in incidents:
        by_kind[str(i.get("kind"))] = by_kind.get(str(i.get("kind")), 0) + 1
    head = "incidents: " + ", ".join(f"{n} {k}" for k, n in sorted(by_kind.items()))
    rows = [INCIDENT_HEADERS] + [
        (
            str(i.get("id", "?")),
            str(i.get("kind", "?")),
            _subject(i),
            str(i.get("decision", "")),
            str(i.get("openedAt", "")),
            on_call(i),
            str(i.get("closeReason") or i.get("reason", "")),
        )
        for i in incidents
    ]
    widths = [max(len(r[k]) for r in rows) for k in range(len(INCIDENT_HEADERS) - 1)]
    return [head] + [
        "  ".join([*(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)), r[-1]]).rstrip()
        for r in rows
    ]


PIPELINE = ("Pending", "Quarantined", "Draining", "Remediating", "Validating", "Returned")


def remediation_lines(remediation: Mapping[str, Any]) -> list[str]:
    """The remediation pipeline (episodes per phase) and the episode table (in progress
    first, then escalated and failed, then returned)."""
    counts = remediation.get("pipeline")
    counts = counts if isinstance(counts, Mapping) else {}
    flow = " → ".join(f"{p} {counts.get(p, 0)}" for p in PIPELINE)
    side = f"Escalated {counts.get('Escalated', 0)}, Failed {counts.get('Failed', 0)}"
    lines = [f"remediation: {flow} | {side}"]
    episodes = [e for e in _list(remediation.get("episodes")) if isinstance(e, Mapping)]
    if episodes:
        lines.append(episode_table(episodes))
        total = remediation.get("total")
        if isinstance(total, int) and total > len(episodes):
            lines.append(f"({total - len(episodes)} older episodes not shown)")
    return lines


def summary_line(fleet: Mapping[str, Any]) -> str:
    nodes: list[Mapping[str, Any]] = list(fleet.get("nodes") or [])
    by_state: dict[str, int] = {}
    for n in nodes:
        by_state[str(n.get("state"))] = by_state.get(str(n.get("state")), 0) + 1
    counts = ", ".join(f"{by_state[s]} {s}" for s in reversed(HEALTH_STATES) if by_state.get(s))
    extra = []
    breaker = fleet.get("breaker")
    if isinstance(breaker, Mapping) and breaker.get("open"):
        extra.append("circuit breaker OPEN")
    if fleet.get("dry_run"):
        extra.append("dry run")
    tail = f" [{'; '.join(extra)}]" if extra else ""
    return f"{len(nodes)} nodes: {counts or 'none'}{tail}"


def exit_code(fleet: Mapping[str, Any]) -> int:
    nodes = fleet.get("nodes") or []
    if any(n.get("state") == "unhealthy" for n in nodes):
        return EXIT_UNHEALTHY
    return EXIT_INCOMPLETE if unavailable_shards(fleet) else EXIT_OK


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="gpuhealth-controller status",
        description="Print the fleet from a running controller (unhealthy nodes first); "
        "exit 1 when any node is unhealthy, 3 when the controller cannot be reached, "
        "4 when a shard could not be read.",
    )
    ap.add_argument("--url", default=DEFAULT_URL, help=f"controller base URL ({DEFAULT_URL})")
    ap.add_argument("--ca-file", help="CA bundle to verify an https:// controller with")
    ap.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
    ap.add_argument("--context", help="kubeconfig context (default: the current one)")
    ap.add_argument("--timeout", type=float, default=REQUEST_TIMEOUT_S, help="seconds")
    ap.add_argument("--json", action="store_true", help="print the fleet JSON instead")
    return ap


def reader_token(kubeconfig: str | None, context: str | None) -> str | None:
    """The kubeconfig user's bearer token, None without one (a controller whose reads are
    open needs none; one whose reads are authorized answers 401, and the message says why)."""
    try:
        return asyncio.run(kubeconfig_token(kubeconfig, context))
    except ConfigError as exc:
        if kubeconfig or context:
            print(f"gpuhealth-controller status: {exc}", file=sys.stderr)
        return None


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    token = reader_token(args.kubeconfig, args.context)
    if token and plain_http_off_host(args.url):
        print(f"warning: sending your token unencrypted to {args.url}", file=sys.stderr)
    try:
        fleet = fetch_fleet(args.url, args.timeout, args.ca_file, token=token)
    except FleetUnavailable as exc:
        print(f"gpuhealth-controller status: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    print(json.dumps(fleet, indent=2) if args.json else render_table(fleet))
    return exit_code(fleet)


if __name__ == "__main__":
    sys.exit(main())
