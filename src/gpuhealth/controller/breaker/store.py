"""The circuit breaker stored in a ConfigMap, so that it survives a restart or a leader change.

``data.state`` is ``open`` or ``closed``; an operator may also close the breaker by editing
it (``kubectl -n gpuhealth patch configmap gpuhealth-breaker --type merge -p
'{"data":{"state":"closed"}}'``), which the leader notices within ``poll_interval_s``.
``data.window`` is the breaker's window: a JSON list of ``{"node", "at", "pool"}``, the nodes
given a hard write within ``breaker.window_s``, when, and in which node pool (``pool`` left out
for a node in none), so that a restarted or new leader keeps counting them against the fleet's
and their pools' budgets. It holds the whole window: the breaker never admits more nodes in
one window than :data:`MAX_WINDOW`, what a ConfigMap can hold (the API server refuses one whose
data passes 1 MiB).

Budgets per node pool: ``data.fleet`` is ``open`` or ``closed`` (the fleet-wide breaker; a
ConfigMap written before pools had budgets has no such key: ``state`` says it), and
``data.pools`` the pools whose own breaker is open, a JSON list of ``{"pool", "trippedAt",
"trips"}`` (at most :data:`MAX_OPEN_POOLS`; the breaker opens the fleet rather than a pool past
that). ``data.state`` is ``open`` while anything is open, so an operator's ``state: closed``
closes the fleet and every pool.

A read that fails (403, 5xx, a timeout) raises our
:class:`~gpuhealth.controller.kube.rest.KubeError`: nothing is known then, and the caller must
not write (``gpuhealth.controller.breaker.sync``); 404 is an answer: nothing stored yet.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from gpuhealth.controller.kube.configmap import read_data, write_data
from gpuhealth.controller.kube.rest import ApiClient

CONFIGMAP_MAX_BYTES = 1024 * 1024
"""The API server refuses a ConfigMap whose keys and values pass 1 MiB together."""
OTHER_DATA_BYTES = 1024
"""Room kept for the keys and the other values (state, fleet, trips, trippedAt, message)."""
NODE_NAME_MAX = 253
"""A Node's name is a DNS subdomain: at most 253 characters."""
POOL_NAME_MAX = 63
"""A pool is a label value: at most 63 characters."""
TIME_MAX = len("2026-11-22T10:00:00.000000+00:00")
"""The longest ``at``: RFC 3339 in UTC with microseconds (``datetime.isoformat``)."""
TRIPS_MAX = len(str(2**63))
ENTRY_MAX_BYTES = len('{"node":"","at":"","pool":""},') + NODE_NAME_MAX + TIME_MAX + POOL_NAME_MAX
"""The most one window entry takes, encoded (378 bytes)."""
MAX_OPEN_POOLS = 64
"""Most pools whose own breaker is open at once; a pool that would trip past them opens the
fleet-wide breaker instead (more storming pools than that is a fleet-wide storm)."""
OPEN_POOL_MAX_BYTES = (
    len('{"pool":"","trippedAt":"","trips":},') + POOL_NAME_MAX + TIME_MAX + TRIPS_MAX
)
POOLS_MAX_BYTES = MAX_OPEN_POOLS * OPEN_POOL_MAX_BYTES + len("[]")
"""The most ``data.pools`` takes."""
MAX_WINDOW = (
    CONFIGMAP_MAX_BYTES - OTHER_DATA_BYTES - POOLS_MAX_BYTES - len("[]")
) // ENTRY_MAX_BYTES
"""Most window entries one ConfigMap holds, whatever the nodes' and pools' names (2,745): the
largest budget the breaker may have (``CircuitBreaker.limit`` is capped at it;
``breaker.min_nodes`` above it is refused), so that the stored window always holds the whole
budget."""


class WindowEntry(msgspec.Struct, frozen=True, omit_defaults=True):
    node: str
    at: str
    """RFC 3339."""
    pool: str = ""
    """The node's pool when it was admitted ("" for none: left out)."""


class OpenPool(msgspec.Struct, frozen=True, rename="camel"):
    """A pool whose own breaker is open."""

    pool: str
    tripped_at: str = ""
    """RFC 3339."""
    trips: int = 0


_window = msgspec.json.Decoder(list[WindowEntry])
_pools = msgspec.json.Decoder(list[OpenPool])


@dataclass(frozen=True, slots=True)
class StoredBreaker:
    open: bool
    """The fleet-wide breaker is open."""
    trips: int = 0
    tripped_at: str = ""
    message: str = ""
    window: tuple[WindowEntry, ...] = ()
    pools: tuple[OpenPool, ...] = ()
    """The pools whose own breaker is open."""

    @property
    def any_open(self) -> bool:
        return self.open or bool(self.pools)


def _parse_window(text: str) -> tuple[WindowEntry, ...]:
    try:
        return tuple(_window.decode(text)[-MAX_WINDOW:]) if text else ()
    except msgspec.DecodeError:
        return ()  # hand-edited or damaged: the state itself still holds


def _parse_pools(text: str) -> tuple[OpenPool, ...]:
    """The open pools; damaged, the fleet-wide state still holds (``state`` open without a
    readable ``pools`` reads as the fleet open: never looser)."""
    return tuple(_pools.decode(text)[:MAX_OPEN_POOLS]) if text else ()


def configmap_data(state: StoredBreaker) -> dict[str, str]:
    """The ConfigMap's ``data`` for ``state`` (the window: its newest :data:`MAX_WINDOW`
    entries, which is all of it: the budget is no larger)."""
    return {
        "state": "open" if state.any_open else "closed",
        "fleet": "open" if state.open else "closed",
        "trips": str(state.trips),
        "trippedAt": state.tripped_at,
        "message": state.message,
        "window": msgspec.json.encode(list(state.window[-MAX_WINDOW:])).decode(),
        "pools": msgspec.json.encode(list(state.pools[:MAX_OPEN_POOLS])).decode(),
    }


def stored_from_data(data: dict[str, object]) -> StoredBreaker:
    """The state ``data`` holds. ``state: closed`` (an operator's reset) closes everything,
    whatever ``fleet`` and ``pools`` say; ``state: open`` with damaged pools opens the fleet."""
    trips = str(data.get("trips", "0"))
    any_open = data.get("state") == "open"
    fleet = data.get("fleet")
    pools: tuple[OpenPool, ...] = ()
    damaged = False
    if any_open:
        try:
            pools = _parse_pools(str(data.get("pools", "")))
        except msgspec.DecodeError:
            damaged = True
    fleet_open = any_open and (fleet is None or fleet == "open" or damaged or not pools)
    return StoredBreaker(
        open=fleet_open,
        trips=int(trips) if trips.isdigit() else 0,
        tripped_at=str(data.get("trippedAt", "")),
        message=str(data.get("message", "")),
        window=_parse_window(str(data.get("window", ""))),
        pools=pools,
    )


class BreakerStore:
    """The breaker's state in one ConfigMap (one process: ``shards.count`` 1)."""

    def __init__(
        self, api: ApiClient, namespace: str, name: str, *, timeout_s: float = 10.0
    ) -> None:
        self._api = api
        self._namespace = namespace
        self._name = name
        self._timeout = timeout_s

    async def load(self) -> StoredBreaker | None:
        data = await read_data(self._api, self._namespace, self._name, timeout_s=self._timeout)
        return None if data is None else stored_from_data(data)

    async def save(self, state: StoredBreaker) -> None:
        await write_data(
            self._api,
            self._namespace,
            self._name,
            configmap_data(state),
            timeout_s=self._timeout,
        )
