"""The circuit breaker stored in a ConfigMap, so that it survives a restart or a leader change.

``data.state`` is ``open`` or ``closed``; an operator may also close the breaker by editing
it (``kubectl -n gpuhealth patch configmap gpuhealth-breaker --type merge -p
'{"data":{"state":"closed"}}'``), which the leader notices within ``poll_interval_s``.
``data.window`` is the breaker's window: a JSON list of ``{"node", "at"}``, the nodes given a
hard write within ``breaker.window_s`` and when (at most :data:`MAX_WINDOW` entries, the
newest), so that a restarted or new leader keeps counting them against the budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

import msgspec

from gpuhealth.controller.kube.rest import MERGE_PATCH, ApiClient, NotFoundError, request

MAX_WINDOW = 2000
"""Most window entries stored (about 100 kB; far above any breaker's budget)."""


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
        data = {
            "state": "open" if state.open else "closed",
            "trips": str(state.trips),
            "trippedAt": state.tripped_at,
            "message": state.message,
            "window": msgspec.json.encode(list(state.window[-MAX_WINDOW:])).decode(),
        }
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
