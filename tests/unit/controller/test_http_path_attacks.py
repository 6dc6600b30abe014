"""Attacks on the operator endpoint: no spelling of the breaker reset reaches its handler
without a token allowed by the SubjectAccessReview (controller/http_auth.py in front of the
real router)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from gpuhealth.controller.http_auth import HttpAuthMetrics, HttpAuthorizer
from gpuhealth.controller.http_settings import HttpAuthSettings
from gpuhealth.controller.stream.auth import StaticAuthenticator
from tests.support.clock import FakeClock
from tests.unit.controller.test_http_auth import TOKENS, Reviewer

RESETS: list[str] = []


async def reset(req: web.Request) -> web.Response:
    RESETS.append(f"{req.method} {req.raw_path}")
    return web.json_response({"reset": True})


async def ok(_req: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def raw_request(port: int, request_line: str, headers: str = "") -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = f"{request_line}\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n"
    writer.write(f"{head}{headers}\r\n".encode())
    await writer.drain()
    status_line = await reader.readline()
    writer.close()
    return int(status_line.split()[1])


SPELLINGS = [
    "POST /api/v1/breaker/reset HTTP/1.1",
    "POST /api/v1/breaker/reset/ HTTP/1.1",
    "POST //api/v1/breaker/reset HTTP/1.1",
    "POST /api/v1//breaker/reset HTTP/1.1",
    "POST /api/v1/breaker%2Freset HTTP/1.1",
    "POST /api/v1/breaker%2freset HTTP/1.1",
    "POST /api/v1/%62reaker/reset HTTP/1.1",
    "POST /API/v1/breaker/reset HTTP/1.1",
    "POST /api/v1/x/../breaker/reset HTTP/1.1",
    "POST /healthz/../api/v1/breaker/reset HTTP/1.1",
    "POST /v1/stream/../../api/v1/breaker/reset HTTP/1.1",
    "POST /api/v1/breaker/./reset HTTP/1.1",
    "POST /api/v1/breaker/reset?x=/healthz HTTP/1.1",
    "POST /api/v1/breaker/reset#/healthz HTTP/1.1",
    "post /api/v1/breaker/reset HTTP/1.1",
    "PoSt /api/v1/breaker/reset HTTP/1.1",
    "PUT /api/v1/breaker/reset HTTP/1.1",
    "GET /api/v1/breaker/reset HTTP/1.1",
    "HEAD /api/v1/breaker/reset HTTP/1.1",
    "OPTIONS /api/v1/breaker/reset HTTP/1.1",
    "POST http://x/api/v1/breaker/reset HTTP/1.1",
    "POST /healthz HTTP/1.1",
    "POST /v1/stream HTTP/1.1",
]


HEADERS = [
    "",
    "X-HTTP-Method-Override: POST\r\n",
    "X-HTTP-Method: POST\r\n",
    "Authorization: Bearer mallory-token\r\n",  # a valid token the SAR refuses
    "Authorization: Bearer " + "a" * 7000 + "\r\n",
]


@pytest.mark.parametrize("normalize", [False, True])
async def test_no_spelling_of_the_reset_skips_the_check(normalize: bool) -> None:
    auth = HttpAuthorizer(
        HttpAuthSettings(cache_ttl_s=5.0),
        StaticAuthenticator(TOKENS),
        Reviewer(),
        namespace="gpuhealth",
        clock=FakeClock(),
        metrics=HttpAuthMetrics(None),
    )
    mws = [auth.middleware]
    if normalize:
        mws.insert(0, web.normalize_path_middleware(append_slash=True, merge_slashes=True))
    app = web.Application(middlewares=mws)
    app.router.add_post("/api/v1/breaker/reset", reset)
    app.router.add_get("/healthz", ok)
    app.router.add_get("/v1/stream", ok)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    RESETS.clear()
    try:
        statuses = {
            (line, extra): await raw_request(port, line, extra)
            for line in SPELLINGS
            for extra in HEADERS
        }
    finally:
        await runner.cleanup()
    assert RESETS == []
    # refused, or (normalize_path_middleware) redirected to a spelling that is checked
    assert not [k for k, status in statuses.items() if status < 300], statuses
