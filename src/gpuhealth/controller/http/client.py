"""The client of the controller's own HTTP API, for the operator's commands
(``gpuhealth-controller status``, ``gpuhealth-controller breaker``).

One blocking request at a time (urllib: a command asks once or a page at a time, and needs no
event loop), ``Accept: application/json``, gzip accepted, an ``https://`` controller verified
with the system's CAs or ``ca_file``, and the operator's bearer token when one is given. Every
answer comes back with its status and its JSON body (an error's too: the controller answers
401/403/409/503 with ``{"error": ..., "message": ...}``); a controller that cannot be asked is
:class:`ControllerUnreachable`.
"""

from __future__ import annotations

import gzip
import ipaddress
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuhealth.common.errors import TransientError

DEFAULT_URL = "http://127.0.0.1:8080"
"""The controller's base URL when none is given (a port-forward to the leader)."""
REQUEST_TIMEOUT_S = 10.0
"""Deadline of one request."""


class ControllerUnreachable(TransientError):
    """The controller could not be asked (refused, timed out, TLS failed)."""


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: dict[str, Any]
    """The JSON answer (a JSON value that is not an object as ``{"value": ...}``; a body that
    is not JSON as ``{"error": "not_json", "message": <its start>}``)."""

    @property
    def ok(self) -> bool:
        return self.status == 200


def plain_http_off_host(url: str) -> bool:
    """A token sent to ``url`` would cross the network unencrypted."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http":
        return False
    host = parts.hostname or ""
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True


def _body(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw or b"{}")
    except ValueError:
        return {"error": "not_json", "message": raw[:200].decode(errors="replace")}
    return value if isinstance(value, dict) else {"value": value}


class ControllerClient:
    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        ca_file: str | None = None,
        timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self.base = url.rstrip("/")
        self._token = token
        self._timeout_s = timeout_s
        self._ssl = (
            ssl.create_default_context(cafile=ca_file) if self.base.startswith("https:") else None
        )

    def url(self, path: str, query: Mapping[str, str] | None = None) -> str:
        return self.base + path + (f"?{urllib.parse.urlencode(query)}" if query else "")

    def request(self, method: str, path: str, query: Mapping[str, str] | None = None) -> Answer:
        """One request; its status and JSON body. Raises :class:`ControllerUnreachable`."""
        target = self.url(path, query)
        req = urllib.request.Request(target, method=method, data=b"" if method == "POST" else None)
        req.add_header("Accept", "application/json")
        req.add_header("Accept-Encoding", "gzip")
        if self._token:
            req.add_header("Authorization", f"Bearer {self._token}")
        try:
            try:
                with urllib.request.urlopen(
                    req, timeout=self._timeout_s, context=self._ssl
                ) as resp:
                    status, raw, headers = resp.status, resp.read(), resp.headers
            except urllib.error.HTTPError as exc:  # an answer all the same
                status, raw, headers = exc.code, exc.read(), exc.headers
        except OSError as exc:
            raise ControllerUnreachable(f"cannot reach {target}: {exc}") from exc
        encoding = headers.get("Content-Encoding") if headers is not None else None
        if encoding == "gzip":
            try:
                raw = gzip.decompress(raw)
            except (OSError, EOFError) as exc:
                raise ControllerUnreachable(f"{target}: a broken gzip answer: {exc}") from exc
        return Answer(status, _body(raw))
