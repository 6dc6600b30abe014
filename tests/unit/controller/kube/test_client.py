"""The API client: no per-request look into the environment (netrc, proxy variables), the
environment's proxy for the API server resolved once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from gpuhealth.controller.kube.client import make_api_client, wait_for_api_server

pytestmark = pytest.mark.asyncio


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, list[str]]]:
    seen: list[str] = []

    async def version(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        return web.json_response({"gitVersion": "v1.36.3"})

    app = web.Application()
    app.router.add_get("/version", version)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


def kubeconfig(tmp_path: Path, url: str) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "{url}"}}}}]
users: [{{name: u, user: {{token: the-token}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
"""
    )
    return str(path)


async def test_a_netrc_entry_for_the_api_server_does_not_break_requests(
    tmp_path: Path, server: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the environment trusted per request, aiohttp would read this netrc entry and refuse
    to combine it with the bearer token (every API call would fail)."""
    url, seen = server
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login someone password secret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    api = await make_api_client(kubeconfig(tmp_path, url))
    try:
        assert await wait_for_api_server(api, 5.0) == "v1.36.3"
    finally:
        await api.close()
    assert seen == ["Bearer the-token"]


@pytest.mark.parametrize(
    ("no_proxy", "want"),
    [("", "http://proxy.example:3128"), ("127.0.0.1", None)],
    ids=["proxied", "no-proxy"],
)
async def test_the_environment_proxy_for_the_api_server_is_resolved_once(
    tmp_path: Path,
    server: tuple[str, list[str]],
    monkeypatch: pytest.MonkeyPatch,
    no_proxy: str,
    want: str | None,
) -> None:
    url, _ = server
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
    if no_proxy:
        monkeypatch.setenv("NO_PROXY", no_proxy)
    api = await make_api_client(kubeconfig(tmp_path, url))
    try:
        assert api.configuration.proxy == want
        assert api.rest_client.pool_manager.trust_env is False
    finally:
        await api.close()
