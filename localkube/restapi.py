"""A few synchronous REST calls to a local API server as admin (the node harness runs in a
thread of its own and needs no event loop for them)."""

from __future__ import annotations

import http.client
import json
import ssl
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

from localkube.process import LocalKubeError

if TYPE_CHECKING:
    from localkube.controlplane import ControlPlane

REQUEST_TIMEOUT_S = 10.0


class AdminApi:
    def __init__(self, control_plane: ControlPlane) -> None:
        self.base = control_plane.url
        pki = control_plane.pki
        self._context = ssl.create_default_context(cafile=str(pki.ca_cert))
        self._context.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        """The decoded JSON answer; None for 404; :class:`LocalKubeError` otherwise.
        ``content_type``: e.g. ``application/merge-patch+json`` for a PATCH."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(
                req, timeout=REQUEST_TIMEOUT_S, context=self._context
            ) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise LocalKubeError(f"{method} {path}: HTTP {exc.code}: {exc.read()[:500]!r}") from exc
        except (OSError, http.client.HTTPException, json.JSONDecodeError) as exc:
            raise LocalKubeError(f"{method} {path}: {exc}") from exc

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def delete(self, path: str, body: Any = None) -> Any:
        return self.request("DELETE", path, body)
