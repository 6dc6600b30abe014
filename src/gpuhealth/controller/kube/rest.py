"""Raw JSON requests through a kubernetes_asyncio ApiClient (auth, TLS and host from it), our
errors for their answers, and the one paged LIST (:func:`list_pages`).

The generated models cost milliseconds per Node to build; the reconciler's hot path
(watch, patch) works on plain dicts decoded with msgspec instead.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
from kubernetes_asyncio import client

from gpuhealth.common.errors import GpuHealthError, PermanentError, TransientError

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
JSON = "application/json"

_decoder = msgspec.json.Decoder()

ApiClient = client.ApiClient
"""Re-exported so that code outside controller/kube/ can name the type."""


class KubeError(GpuHealthError):
    """An API request failed; ``status`` is the HTTP status (0 when none came back)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class ConflictError(KubeError, TransientError):
    """409: the object changed since it was read (or already exists, on create)."""


class NotFoundError(KubeError, PermanentError):
    """404."""


class GoneError(KubeError, TransientError):
    """410: a watch's resourceVersion is too old; relist."""


class TransientKubeError(KubeError, TransientError):
    """5xx, 429, timeouts, dropped connections."""


class PermanentKubeError(KubeError, PermanentError):
    """4xx other than the above: forbidden, invalid."""


def error_for(status: int, message: str) -> KubeError:
    if status == 409:
        return ConflictError(message, status)
    if status == 404:
        return NotFoundError(message, status)
    if status == 410:
        return GoneError(message, status)
    if status == 429 or status >= 500 or status == 0:
        return TransientKubeError(message, status)
    return PermanentKubeError(message, status)


async def open_request(
    api: client.ApiClient,
    method: str,
    path: str,
    *,
    query: list[tuple[str, str]] | None = None,
    body: Any = None,
    content_type: str = JSON,
    timeout_s: float | tuple[float, float] | None = None,
    accept: str = JSON,
) -> Any:
    """Send a request and return the raw aiohttp response (the caller reads and releases it)."""
    headers = {"Accept": accept, "Content-Type": content_type}
    try:
        return await api.call_api(
            path,
            method,
            query_params=query or [],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=timeout_s,
        )
    except TimeoutError as exc:
        raise TransientKubeError(f"{method} {path}: timed out", 0) from exc
    except OSError as exc:
        raise TransientKubeError(f"{method} {path}: {exc}", 0) from exc
    except Exception as exc:
        if type(exc).__module__.startswith("aiohttp"):
            raise TransientKubeError(f"{method} {path}: {exc}", 0) from exc
        raise


async def request(
    api: client.ApiClient,
    method: str,
    path: str,
    *,
    query: list[tuple[str, str]] | None = None,
    body: Any = None,
    content_type: str = JSON,
    timeout_s: float | None = None,
    accept: str = JSON,
) -> dict[str, Any]:
    """One request; the decoded JSON answer (``accept``: its media type, a JSON one), or a
    :class:`KubeError` by status."""
    resp = await open_request(
        api,
        method,
        path,
        query=query,
        body=body,
        content_type=content_type,
        timeout_s=timeout_s,
        accept=accept,
    )
    try:
        data = await resp.read()
    except Exception as exc:
        raise TransientKubeError(f"{method} {path}: reading the answer: {exc}", 0) from exc
    finally:
        resp.release()
    if not 200 <= resp.status < 300:
        text = data[:500].decode("utf-8", "replace")
        raise error_for(resp.status, f"{method} {path}: HTTP {resp.status}: {text}")
    if not data:
        return {}
    decoded = _decoder.decode(data)
    return decoded if isinstance(decoded, dict) else {"items": decoded}


@dataclass(frozen=True, slots=True)
class ListPage:
    """One page of a LIST."""

    items: list[dict[str, Any]]
    resource_version: str
    """The collection's resourceVersion: the snapshot every page of the LIST is served from."""
    restarted: bool = False
    """The first page of the LIST started again (the continue token had expired)."""


async def list_pages(
    api: client.ApiClient,
    path: str,
    *,
    query: Sequence[tuple[str, str]] = (),
    limit: int,
    timeout_s: float,
) -> AsyncIterator[ListPage]:
    """A LIST in pages of ``limit`` objects (``limit`` and ``continue``; 0: the whole collection
    in one answer): the API server serves every page from the snapshot of the first, and the
    caller handles a page before the next is asked for. A continue token that expired meanwhile
    (410 Gone: the snapshot was compacted) starts the LIST again, whole, in one answer, as
    client-go's pager does (the first page after it says ``restarted``); a 410 on the first
    page, and every other error, is raised (:class:`KubeError`)."""
    token = ""
    restarted = False
    while True:
        page_query = list(query)
        if limit:
            page_query.append(("limit", str(limit)))
        if token:
            page_query.append(("continue", token))
        try:
            data = await request(api, "GET", path, query=page_query, timeout_s=timeout_s)
        except GoneError:
            if not token:
                raise
            token, limit, restarted = "", 0, True
            continue
        meta = data.get("metadata") or {}
        yield ListPage(
            list(data.get("items") or ()), str(meta.get("resourceVersion", "")), restarted
        )
        restarted = False
        token = str(meta.get("continue") or "")
        if not token:
            return
