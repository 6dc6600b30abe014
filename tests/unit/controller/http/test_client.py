"""The one client of the controller's own API (``gpuhealth-controller status`` and
``breaker``): against a real local HTTP server, every answer comes back with its status and
JSON body, gzip undone, the token sent; a controller that cannot be asked is our error."""

from __future__ import annotations

import gzip
import http.server
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from gpuhealth.controller.http.client import (
    ControllerClient,
    ControllerUnreachable,
    plain_http_off_host,
)


class _Api(http.server.BaseHTTPRequestHandler):
    """Answers by path; remembers what each request carried."""

    seen: ClassVar[list[dict[str, Any]]] = []

    def _answer(self) -> None:
        _Api.seen.append({"method": self.command, "path": self.path, **dict(self.headers)})
        status, body, gz = {
            "/api/v1/breaker": (200, json.dumps({"open": False}).encode(), True),
            "/api/v1/breaker/reset": (403, b'{"error": "forbidden", "message": "no"}', False),
            "/text": (502, b"<html>bad gateway</html>", False),
            "/list": (200, b"[1, 2]", False),
        }[self.path.partition("?")[0]]
        if gz:
            body = gzip.compress(body)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if gz:
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = _answer
    do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def base() -> Iterator[str]:
    server = http.server.HTTPServer(("127.0.0.1", 0), _Api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Api.seen.clear()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_a_gzip_answer_is_read_and_the_token_sent(base: str) -> None:
    answer = ControllerClient(base, token="t0k").request("GET", "/api/v1/breaker", {"a": "b"})
    assert (answer.status, answer.body, answer.ok) == (200, {"open": False}, True)
    seen = _Api.seen[-1]
    assert seen["path"] == "/api/v1/breaker?a=b"
    assert seen["Authorization"] == "Bearer t0k" and seen["Accept-Encoding"] == "gzip"


def test_an_error_answer_is_an_answer(base: str) -> None:
    answer = ControllerClient(base).request("POST", "/api/v1/breaker/reset")
    assert (answer.status, answer.body["error"], answer.ok) == (403, "forbidden", False)
    assert "Authorization" not in _Api.seen[-1] and _Api.seen[-1]["method"] == "POST"


def test_a_body_that_is_not_a_json_object_is_kept(base: str) -> None:
    assert ControllerClient(base).request("GET", "/text").body == {
        "error": "not_json",
        "message": "<html>bad gateway</html>",
    }
    assert ControllerClient(base).request("GET", "/list").body == {"value": [1, 2]}


def test_a_controller_that_cannot_be_asked_is_our_error() -> None:
    with socket.socket() as s:  # bound, never listening
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        with pytest.raises(ControllerUnreachable, match="cannot reach"):
            ControllerClient(url, timeout_s=0.5).request("GET", "/api/v1/breaker")


@pytest.mark.parametrize(
    ("url", "exposed"),
    [
        ("http://10.0.0.5:8080", True),
        ("http://controller.gpuhealth.svc:8080", True),
        ("http://127.0.0.1:8080", False),
        ("http://[::1]:8080", False),
        ("http://localhost:8080", False),
        ("https://10.0.0.5:8080", False),
    ],
)
def test_a_token_in_plain_http_off_the_host_is_noticed(url: str, exposed: bool) -> None:
    assert plain_http_off_host(url) is exposed
