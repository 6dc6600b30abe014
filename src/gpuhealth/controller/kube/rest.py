"""Raw JSON requests through a kubernetes_asyncio ApiClient (auth, TLS and host from it).

The generated models cost milliseconds per Node to build; the reconciler's hot path
(watch, patch) works on plain dicts decoded with msgspec instead.
"""

from __future__ import annotations

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
