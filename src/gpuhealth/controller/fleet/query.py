"""What a reader asks of the fleet (``GET /api/v1/fleet`` and ``/api/v1/overview`` query
parameters) and what a node is summarised to for the asking: pure, no I/O.

- ``state=unhealthy,degraded`` (repeatable): nodes in any of these states;
- ``pool=a100-pool`` (repeatable, comma-separated): nodes of these node pools (the first of
  ``fleet.pool_labels`` a Node carries; ``""`` for none: :mod:`gpuhealth.controller.fleet.pools`);
- ``reason=xid-79`` (repeatable, comma-separated): nodes with any of these condition codes
  (or ``agent-silent``, ``no-agent``, ``no-report``, ``gpu-missing``);
- ``label=k=v,k!=v,k,!k`` (repeatable, all must hold): a Kubernetes equality-based label
  selector over the Node's labels;
- ``limit=N`` (1..:data:`MAX_LIMIT`) and ``continue=TOKEN``: one page in natural name order;
  the answer's ``continue`` token asks for the next page (with the same filters).

Every filter is applied to :class:`FleetNodeSummary` values, which the fleet cache keeps per node.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpuhealth.protocol import HEALTH_STATES

MAX_LIMIT = 5000
"""The largest page one request may ask for (``limit``)."""

NO_AGENT = "no-agent"
NO_REPORT = "no-report"
AGENT_SILENT = "agent-silent"


class QueryError(ValueError):
    """A query parameter the API cannot honour (answered 400 with this text)."""


@dataclass(frozen=True, slots=True)
class FleetNodeSummary:
    """What filters, counts and groups read of one node."""

    name: str
    state: str
    pool: str
    reason: str
    """The node's primary reason: the code that made it ``state`` ("" when healthy)."""
    reasons: frozenset[str]
    labels: Mapping[str, str]
    tainted: bool
    """It carries a gpuhealth taint."""
    connected: bool
    gpus: tuple[int, ...]
    """GPUs by state, in :data:`HEALTH_STATES` order."""


@dataclass(frozen=True, slots=True)
class LabelRequirement:
    key: str
    op: str
    """``=``, ``!=``, ``exists`` or ``!exists``."""
    value: str = ""

    def holds(self, labels: Mapping[str, str]) -> bool:
        if self.op == "exists":
            return self.key in labels
        if self.op == "!exists":
            return self.key not in labels
        if self.op == "=":
            return labels.get(self.key) == self.value
        return labels.get(self.key) != self.value


def parse_selector(text: str) -> tuple[LabelRequirement, ...]:
    """``k=v,k==v,k!=v,k,!k`` (equality-based, as ``kubectl -l``); set-based forms are
    refused."""
    reqs = []
    for raw in text.split(","):
        part = raw.strip()
        if not part:
            continue
        if "(" in part or " in " in part or " notin " in part:
            raise QueryError(f"label: set-based selectors are not supported: {part!r}")
        if "!=" in part:
            key, value = part.split("!=", 1)
            reqs.append(LabelRequirement(key.strip(), "!=", value.strip()))
        elif "=" in part:
            key, value = part.split("==", 1) if "==" in part else part.split("=", 1)
            reqs.append(LabelRequirement(key.strip(), "=", value.strip()))
        elif part.startswith("!"):
            reqs.append(LabelRequirement(part[1:].strip(), "!exists"))
        else:
            reqs.append(LabelRequirement(part, "exists"))
    for r in reqs:
        if not r.key:
            raise QueryError(f"label: a requirement without a key in {text!r}")
    return tuple(reqs)


@dataclass(frozen=True, slots=True)
class FleetFilter:
    """Empty sets and no label requirements: every node."""

    states: frozenset[str] = frozenset()
    pools: frozenset[str] | None = None
    reasons: frozenset[str] = frozenset()
    labels: tuple[LabelRequirement, ...] = ()

    @property
    def everything(self) -> bool:
        return not self.states and self.pools is None and not self.reasons and not self.labels

    def matches(self, s: FleetNodeSummary) -> bool:
        if self.states and s.state not in self.states:
            return False
        if self.pools is not None and s.pool not in self.pools:
            return False
        if self.reasons and not (self.reasons & s.reasons):
            return False
        return all(r.holds(s.labels) for r in self.labels)


@dataclass(frozen=True, slots=True)
class FleetQuery:
    filter: FleetFilter = FleetFilter()
    limit: int | None = None
    """None: every matching node."""
    after: str | None = None
    """The last node name of the previous page (from the continue token)."""

    @property
    def everything(self) -> bool:
        return self.filter.everything and self.limit is None and self.after is None


def problems_first(states: Sequence[str], limit: int) -> list[int]:
    """Which of nodes in ``states`` (in their order) to list when at most ``limit`` may be:
    all when they fit, else those not healthy first, then healthy ones to fill; their
    indexes, in order."""
    if len(states) <= limit:
        return list(range(len(states)))
    shown = [i for i, state in enumerate(states) if state != "healthy"][:limit]
    taken = set(shown)
    shown += [i for i in range(len(states)) if i not in taken][: limit - len(shown)]
    return sorted(shown)


def encode_continue(after: str) -> str:
    return base64.urlsafe_b64encode(b"1:" + after.encode()).decode().rstrip("=")


def decode_continue(token: str) -> str:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise QueryError("continue: not a token this API issued") from exc
    version, sep, after = raw.partition(":")
    if version != "1" or not sep or not after:
        raise QueryError("continue: not a token this API issued")
    return after


def _values(params: Iterable[tuple[str, str]], key: str) -> list[str]:
    return [v.strip() for k, val in params if k == key for v in val.split(",")]


def parse_query(params: Iterable[tuple[str, str]]) -> FleetQuery:
    """The query of ``GET /api/v1/fleet`` from its (key, value) pairs (repeated keys
    allowed); unknown keys are ignored, bad values raise :class:`QueryError`."""
    pairs = list(params)
    states = frozenset(s for s in _values(pairs, "state") if s)
    unknown = states - set(HEALTH_STATES)
    if unknown:
        raise QueryError(f"state: unknown {sorted(unknown)}; one of {list(HEALTH_STATES)}")
    pools = _values(pairs, "pool")
    limit: int | None = None
    limits = [v for k, v in pairs if k == "limit"]
    if limits:
        try:
            limit = int(limits[-1])
        except ValueError as exc:
            raise QueryError(f"limit: not an integer: {limits[-1]!r}") from exc
        if not 1 <= limit <= MAX_LIMIT:
            raise QueryError(f"limit: must be 1..{MAX_LIMIT}")
    tokens = [v for k, v in pairs if k == "continue" and v]
    return FleetQuery(
        filter=FleetFilter(
            states=states,
            pools=frozenset(pools) if pools else None,
            reasons=frozenset(r for r in _values(pairs, "reason") if r),
            labels=tuple(r for k, v in pairs if k == "label" for r in parse_selector(v)),
        ),
        limit=limit,
        after=decode_continue(tokens[-1]) if tokens else None,
    )
