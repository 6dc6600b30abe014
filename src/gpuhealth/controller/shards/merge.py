"""The shards' answers merged into one fleet-wide read (pure).

- **ShardCoverage** (:func:`coverage`): each owner's answer names the shards it held when it
  answered (``shards``). An answer is taken when its shards are new to the merge; one that
  holds a shard already counted (a shard changing hands between two answers) is left out
  whole, since its counts cannot be split. Every shard of ``0..count-1`` that no answer
  taken covers is ``unavailable``, with the reason: a merged read never answers a part as
  the whole.
- **Overview** (:func:`merge_overviews`): the sum of the shards' grouped counts (state, node
  pool, reason) and summary, the nodes listed cut again at ``limit`` (problem nodes first,
  then in natural name order, :func:`gpuhealth.controller.fleet.query.problems_first`, as
  for one replica); the cluster-wide parts (incidents, remediation episodes: every
  replica watches the same objects) from the first answer.
- **Fleet pages** walk the shards in order: the ``continue`` token (:func:`encode_walk`)
  carries the shard and the shard's own token inside it (its position there); a token this
  API did not issue, or for another shard count, is refused (:func:`decode_walk`).
"""

from __future__ import annotations

import base64
import binascii
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuhealth.controller.fleet.query import QueryError, decode_continue, problems_first
from gpuhealth.controller.fleet.view import natural_key
from gpuhealth.controller.shards.peers import ShardAnswer
from gpuhealth.protocol import severity

WALK_VERSION = "s1"


@dataclass(frozen=True, slots=True)
class Walk:
    """Where a fleet walk stands: the shard, and the shard's own ``continue`` token (None: its
    first page)."""

    shard: int
    inner: str | None = None


def encode_walk(walk: Walk) -> str:
    raw = f"{WALK_VERSION}:{walk.shard}:{walk.inner or ''}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_walk(token: str, count: int) -> Walk:
    """The walk ``token`` stands for; :class:`QueryError` (a 400) for anything this API did
    not issue for ``count`` shards."""
    bad = QueryError("continue: not a token this API issued for the whole fleet")
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise bad from exc
    version, _, rest = raw.partition(":")
    shard_text, sep, inner = rest.partition(":")
    if version != WALK_VERSION or not sep or not shard_text.isdigit():
        raise bad
    shard = int(shard_text)
    if shard >= count or shard_text != str(shard):
        raise QueryError(f"continue: a token for shard {shard_text}; there are {count} shards")
    if inner:
        decode_continue(inner)  # the shard's own token: refused here when it is not one
    return Walk(shard, inner or None)


@dataclass(frozen=True, slots=True)
class ShardCoverage:
    taken: tuple[dict[str, Any], ...]
    """The documents counted, each for the shards it names."""
    unavailable: Mapping[int, str]
    """Shard -> why it is not in the merged answer."""

    def unavailable_json(self) -> list[dict[str, Any]]:
        return [{"shard": i, "reason": why} for i, why in sorted(self.unavailable.items())]


def held_shards(body: Mapping[str, Any], count: int) -> frozenset[int]:
    """The shards a ``scope=local`` document says it holds (anything else in ``shards``
    ignored)."""
    held = body.get("shards")
    if not isinstance(held, list):
        return frozenset()
    return frozenset(i for i in held if isinstance(i, int) and 0 <= i < count)


def coverage(answers: Iterable[ShardAnswer], count: int) -> ShardCoverage:
    covered: set[int] = set()
    unavailable: dict[int, str] = {}
    taken: list[dict[str, Any]] = []
    for answer in answers:
        if answer.body is None:
            for i in answer.shards:
                unavailable.setdefault(i, answer.reason)
            continue
        held = held_shards(answer.body, count)
        if held & covered:
            for i in answer.shards:
                if i not in covered:
                    unavailable.setdefault(i, "changing hands: held by two answers; read again")
            continue
        for i in set(answer.shards) - held:
            unavailable.setdefault(i, "its owner no longer holds it; read again")
        covered |= held
        taken.append(answer.body)
    for i in range(count):
        if i in covered:
            unavailable.pop(i, None)
        else:
            unavailable.setdefault(i, "not read")
    return ShardCoverage(tuple(taken), unavailable)


def _sum_maps(maps: Iterable[object]) -> dict[str, int]:
    total: Counter[str] = Counter()
    for m in maps:
        if isinstance(m, Mapping):
            total.update({str(k): v for k, v in m.items() if isinstance(v, int)})
    return dict(total)


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def sum_groups(docs: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The overviews' ``groups`` summed per (state, pool, reason), the worst state first,
    then pool and reason (the order of one replica's groups)."""
    total: Counter[tuple[str, str, str]] = Counter()
    for doc in docs:
        for g in _list(doc.get("groups")):
            if isinstance(g, Mapping):
                key = (str(g.get("state")), str(g.get("pool", "")), str(g.get("reason", "")))
                total[key] += _int(g.get("nodes"))
    return [
        {"state": state, "pool": pool, "reason": reason, "nodes": n}
        for (state, pool, reason), n in sorted(
            total.items(), key=lambda kv: (-severity(kv[0][0]), kv[0][1], kv[0][2])
        )
        if n > 0
    ]


def pick_nodes(nodes: Sequence[Mapping[str, Any]], limit: int) -> list[Mapping[str, Any]]:
    """At most ``limit`` of the shards' listed nodes in natural name order: all when they
    fit, else the nodes that are not healthy first, then healthy ones to fill."""
    ordered = sorted(nodes, key=lambda n: (natural_key(str(n.get("name"))), str(n.get("name"))))
    return [ordered[i] for i in problems_first([str(n.get("state")) for n in ordered], limit)]


def merge_events(docs: Sequence[Mapping[str, Any]]) -> list[Any]:
    """The replicas' recent activity (each its own nodes'), newest first, as many as the
    longest of them (each is cut at the same number)."""
    events = [e for d in docs for e in _list(d.get("events")) if isinstance(e, Mapping)]
    shown = max((len(_list(d.get("events"))) for d in docs), default=0)
    return sorted(events, key=lambda e: str(e.get("at", "")), reverse=True)[:shown]


SUMMARY_COUNTS = (
    "nodes",
    "gpus",
    "tainted_nodes",
    "idle_allocations",
    "connected_agents",
)
SUMMARY_MAPS = ("nodes_by_state", "gpus_by_state")


def shards_json(count: int, cover: ShardCoverage) -> dict[str, Any]:
    """The merged answer's ``shards``: how many, which were read, which are unavailable."""
    return {
        "count": count,
        "read": sorted(set(range(count)) - cover.unavailable.keys()),
        "unavailable": cover.unavailable_json(),
    }


def merge_overviews(answers: Iterable[ShardAnswer], count: int, limit: int) -> dict[str, Any]:
    """One ``/api/v1/overview`` of the whole fleet from the owners' ``scope=local`` ones."""
    cover = coverage(answers, count)
    docs = cover.taken
    first: Mapping[str, Any] = docs[0] if docs else {}
    summaries = [_map(d.get("summary")) for d in docs]
    summary: dict[str, Any] = {k: sum(_int(s.get(k)) for s in summaries) for k in SUMMARY_COUNTS}
    summary.update({k: _sum_maps(s.get(k) for s in summaries) for k in SUMMARY_MAPS})
    idle = [d.get("idle") for d in docs]
    return {
        **first,
        "summary": summary,
        "groups": sum_groups(docs),
        "nodes_matched": sum(_int(d.get("nodes_matched")) for d in docs),
        "nodes": pick_nodes([n for d in docs for n in _list(d.get("nodes"))], limit),
        "idle": None if all(i is None for i in idle) else [a for i in idle for a in _list(i)],
        "events": merge_events(docs),
        "breakers": [
            {"shards": sorted(held_shards(d, count)), "breaker": d.get("breaker")} for d in docs
        ],
        "shards": shards_json(count, cover),
    }


@dataclass
class FleetPage:
    """A merged ``/api/v1/fleet`` page being assembled shard by shard: each answer is one
    shard's nodes (its owner asked for that shard alone), and a shard its owner did not
    hold when it answered is unavailable."""

    count: int
    answers: list[ShardAnswer] = field(default_factory=list)
    nodes: list[Any] = field(default_factory=list)
    unavailable: dict[int, str] = field(default_factory=dict)

    def add(self, answer: ShardAnswer) -> bool:
        """Take one shard's answer; whether its nodes are in the page."""
        self.answers.append(answer)
        (shard,) = answer.shards
        if answer.body is None:
            self.unavailable[shard] = answer.reason
            return False
        if shard not in held_shards(answer.body, self.count):
            self.unavailable[shard] = "its owner no longer holds it; read again"
            return False
        self.nodes.extend(_list(answer.body.get("nodes")))
        return True

    def document(self, after: Walk | None) -> dict[str, Any]:
        """The page: the first answer's head (generated, leader, breaker, remediation,
        incidents), ``summary`` summed over the owners read for it (each once),
        ``continue`` the walk's next step (None: the last page), ``shards``: which were read
        for this page and which of them are unavailable."""
        docs: list[Mapping[str, Any]] = []
        counted: set[int] = set()
        for a in self.answers:
            held = held_shards(a.body, self.count) if a.body is not None else frozenset()
            if a.body is not None and held and not held & counted:
                counted |= held
                docs.append(a.body)
        first: Mapping[str, Any] = docs[0] if docs else {}
        summaries = [d.get("summary") for d in docs]
        asked = sorted({i for a in self.answers for i in a.shards})
        return {
            **first,
            "summary": {
                k: _sum_maps(s.get(k) for s in summaries if isinstance(s, Mapping))
                for k in ("nodes", "gpus")
            },
            "nodes": self.nodes,
            "continue": encode_walk(after) if after is not None else None,
            "shards": {
                "count": self.count,
                "read": [i for i in asked if i not in self.unavailable],
                "unavailable": [
                    {"shard": i, "reason": why} for i, why in sorted(self.unavailable.items())
                ],
            },
        }
