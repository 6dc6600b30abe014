"""The circuit breaker stored in a ConfigMap, so that it survives a restart or a leader change.

``data.state`` is ``open`` or ``closed``; an operator may also close the breaker by editing
it (``kubectl -n gpuhealth patch configmap gpuhealth-breaker --type merge -p
'{"data":{"state":"closed"}}'``), which the leader notices within ``poll_interval_s``.
``data.window`` is the breaker's window: a JSON list of ``{"node", "at"}``, the nodes given a
hard write within ``breaker.window_s`` and when, so that a restarted or new leader keeps
counting them against the budget. It holds the whole window: the breaker never admits more
nodes in one window than :data:`MAX_WINDOW`, what a ConfigMap can hold (the API server refuses
one whose data passes 1 MiB).

A read that fails (403, 5xx, a timeout) raises our
:class:`~gpuhealth.controller.kube.rest.KubeError`: nothing is known then, and the caller must
not write (``gpuhealth.controller.breaker.sync``); 404 is an answer: nothing stored yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

import msgspec

from gpuhealth.controller.kube.rest import MERGE_PATCH, ApiClient, NotFoundError, request

CONFIGMAP_MAX_BYTES = 1024 * 1024
"""The API server refuses a ConfigMap whose keys and values pass 1 MiB together."""
OTHER_DATA_BYTES = 1024
"""Room kept for the keys and the other values (state, trips, trippedAt, message)."""
NODE_NAME_MAX = 253
"""A Node's name is a DNS subdomain: at most 253 characters."""
TIME_MAX = len("2026-11-22T10:00:00.000000+00:00")
"""The longest ``at``: RFC 3339 in UTC with microseconds (``datetime.isoformat``)."""
ENTRY_MAX_BYTES = len('{"node":"","at":""},') + NODE_NAME_MAX + TIME_MAX
"""The most one window entry takes, encoded (305 bytes)."""
MAX_WINDOW = (CONFIGMAP_MAX_BYTES - OTHER_DATA_BYTES - len("[]")) // ENTRY_MAX_BYTES
"""Most window entries one ConfigMap holds, whatever the nodes' names (3,434): the largest
budget the breaker may have (``CircuitBreaker.limit`` is capped at it; ``breaker.min_nodes``
above it is refused), so that the stored window always holds the whole budget."""


class WindowEntry(msgspec.Struct, frozen=True):
    node: str
    at: str
    """RFC 3339."""


_window = msgspec.json.Decoder(list[WindowEntry])


@dataclass(frozen=True, slots=True)
class StoredBreaker:
    open: bool
    trips: int = 0
    tripped_at: str = ""
    message: str = ""
    window: tuple[WindowEntry, ...] = ()


def _parse_window(text: str) -> tuple[WindowEntry, ...]:
    try:
        return tuple(_window.decode(text)[-MAX_WINDOW:]) if text else ()
    except msgspec.DecodeError:
        return ()  # hand-edited or damaged: the state itself still holds


def configmap_data(state: StoredBreaker) -> dict[str, str]:
    """The ConfigMap's ``data`` for ``state`` (the window: its newest :data:`MAX_WINDOW`
    entries, which is all of it: the budget is no larger)."""
    return {
        "state": "open" if state.open else "closed",
        "trips": str(state.trips),
        "trippedAt": state.tripped_at,
        "message": state.message,
        "window": msgspec.json.encode(list(state.window[-MAX_WINDOW:])).decode(),
    }


class BreakerStore:
    def __init__(
        self, api: ApiClient, namespace: str, name: str, *, timeout_s: float = 10.0
    ) -> None:
        self._api = api
        self._path = f"/api/v1/namespaces/{quote(namespace)}/configmaps"
        self._namespace = namespace
        self._name = name
        self._timeout = timeout_s

    async def load(self) -> StoredBreaker | None:
        try:
            cm = await request(
                self._api, "GET", f"{self._path}/{quote(self._name)}", timeout_s=self._timeout
            )
        except NotFoundError:
            return None
        data = cm.get("data") or {}
        trips = str(data.get("trips", "0"))
        return StoredBreaker(
            open=data.get("state") == "open",
            trips=int(trips) if trips.isdigit() else 0,
            tripped_at=str(data.get("trippedAt", "")),
            message=str(data.get("message", "")),
            window=_parse_window(str(data.get("window", ""))),
        )

    async def save(self, state: StoredBreaker) -> None:
        data = configmap_data(state)
        try:
            await request(
                self._api,
                "PATCH",
                f"{self._path}/{quote(self._name)}",
                body={"data": data},
                content_type=MERGE_PATCH,
                timeout_s=self._timeout,
            )
        except NotFoundError:
            body = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": self._name, "namespace": self._namespace},
                "data": data,
            }
            await request(self._api, "POST", self._path, body=body, timeout_s=self._timeout)
