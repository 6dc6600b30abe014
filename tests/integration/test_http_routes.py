"""Every route the controller serves, through the assembled product: a real
``gpuhealth-controller`` process (the chart's configuration, ServiceAccount and RBAC) behind
every middleware it installs (slow-client and body-size bounds, authentication and
authorization), one valid request and at least one bad one per route, in both read modes.

The routes walked must be exactly the routes the composed application has (built in-process
from the same configuration), so a new route without a case here fails, and a middleware that
breaks a handler is seen here rather than in a cluster.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
import yaml

from gpuhealth.controller.compose import build_controller
from gpuhealth.controller.kube.client import make_api_client
from gpuhealth.controller.kube.rest import request
from gpuhealth.controller.settings import load_config
from gpuhealth.protocol import Ack, Error, ErrorCode
from gpuhealth.protocol.codec import decode_controller
from localkube import ControlPlane
from localkube.objects import GPU_RESOURCE
from tests.integration.controller_helpers import Cluster, cluster, controller_process, merge
from tests.support.frames import hello_frame
from tests.support.wait import until

pytestmark = pytest.mark.integration

HTTP_BODY_BYTES = 64 << 10
"""``http.max_body_bytes`` (the default): every route but the extender's."""
EXTENDER_BODY_BYTES = 4 << 20
"""``extender.max_body_bytes`` for this test: above the default body limit of other routes."""
OVERRIDES = {"extender": {"max_body_bytes": EXTENDER_BODY_BYTES}}
RBAC = "/apis/rbac.authorization.k8s.io/v1"

POD = {"spec": {"containers": [{"name": "c", "resources": {"limits": {GPU_RESOURCE: "1"}}}]}}


def full_nodes(n: int) -> list[dict[str, Any]]:
    """``n`` Node objects as kube-scheduler sends them when nodeCacheCapable is false."""
    return [
        {"metadata": {"name": f"n-{i}", "labels": {"pad": "x" * 250}}, "status": {}}
        for i in range(n)
    ]


@dataclass
class Caller:
    """One HTTP client of the controller process with the identities a test needs."""

    http: aiohttp.ClientSession
    base: str
    tokens: dict[str, str]
    """``operator``, ``viewer``, ``scraper`` (may ``get /metrics``), ``agent`` (bound to
    ``node``), ``forged``."""
    node: str

    def auth(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who]}"} if who else {}

    async def call(
        self, method: str, path: str, *, who: str = "", data: bytes | None = None
    ) -> tuple[int, bytes]:
        async with self.http.request(
            method, self.base + path, headers=self.auth(who), data=data
        ) as r:
            return r.status, await r.read()

    async def stream(self, who: str) -> Ack | Error:
        """Open the agents' stream with ``who``'s token and send a Hello; the first answer."""
        url = self.base.replace("http", "ws", 1) + "/v1/stream"
        async with self.http.ws_connect(url, headers=self.auth(who)) as ws:
            await ws.send_bytes(hello_frame(self.node, stream=uuid.uuid4().hex))
            async with asyncio.timeout(10):
                reply = decode_controller((await ws.receive()).data)
        assert isinstance(reply, Ack | Error), reply
        return reply


Check = Callable[[Caller, str], Awaitable[None]]
"""A route's checks, given the read mode (``open`` or ``authorized``)."""


def reader(mode: str) -> str:
    """Who may read: anyone when reads are open, else a viewer."""
    return "viewer" if mode == "authorized" else ""


async def refused_without_token(c: Caller, mode: str, method: str, path: str) -> None:
    """A read route: in ``authorized`` mode no token is 401, a forged one too; in either mode
    a state-changing method needs an allowed token (401 without one, 403 for a viewer)."""
    if mode == "authorized":
        assert (await c.call(method, path))[0] == 401
        assert (await c.call(method, path, who="forged"))[0] == 401
    assert (await c.call("DELETE", path))[0] == 401
    assert (await c.call("DELETE", path, who="viewer"))[0] == 403


def scraper(mode: str) -> str:
    """Who may scrape: anyone when reads are open, else a token that may ``get /metrics``."""
    return "scraper" if mode == "authorized" else ""


async def metrics(c: Caller, mode: str) -> None:
    status, body = await c.call("GET", "/metrics", who=scraper(mode))
    assert status == 200 and b"gpuhealth_extender_requests_total" in body
    if mode == "authorized":  # the fleet viewer is not a scraper
        assert (await c.call("GET", "/metrics", who="viewer"))[0] == 403
    await refused_without_token(c, mode, "GET", "/metrics")


def probe(path: str, field: str) -> Check:
    """Probes are open whatever the read mode; only GET is served."""

    async def check(c: Caller, _mode: str) -> None:
        status, body = await c.call("GET", path)
        assert status == 200, body
        assert msgspec.json.decode(body)[field] is True
        assert (await c.call("POST", path, data=b"{}"))[0] == 405

    return check


async def fleet(c: Caller, mode: str) -> None:
    status, body = await c.call("GET", "/api/v1/fleet", who=reader(mode))
    assert status == 200
    assert "nodes" in msgspec.json.decode(body)
    await refused_without_token(c, mode, "GET", "/api/v1/fleet")


async def incidents(c: Caller, mode: str) -> None:
    status, body = await c.call("GET", "/api/v1/incidents", who=reader(mode))
    assert status == 200 and "incidents" in msgspec.json.decode(body)
    status, body = await c.call("GET", "/api/v1/incidents?state=bogus", who=reader(mode))
    assert status == 400 and "state" in msgspec.json.decode(body)["error"]
    await refused_without_token(c, mode, "GET", "/api/v1/incidents")


async def breaker(c: Caller, mode: str) -> None:
    status, body = await c.call("GET", "/api/v1/breaker", who=reader(mode))
    assert status == 200 and "open" in msgspec.json.decode(body)
    await refused_without_token(c, mode, "GET", "/api/v1/breaker")


async def breaker_reset(c: Caller, _mode: str) -> None:
    path = "/api/v1/breaker/reset"
    assert (await c.call("POST", path))[0] == 401
    assert (await c.call("POST", path, who="forged"))[0] == 401
    assert (await c.call("POST", path, who="viewer"))[0] == 403
    # a body over http.max_body_bytes is refused before anyone reviews the token
    big = b"x" * (HTTP_BODY_BYTES + 1)
    status, body = await c.call("POST", path, who="operator", data=big)
    assert status == 413 and msgspec.json.decode(body)["error"] == "request_too_large"
    status, body = await c.call("POST", path, who="operator")
    assert status == 200 and msgspec.json.decode(body)["reset"] is True


async def page_file(c: Caller, path: str) -> bytes:
    """The status page's own files hold no data: read without a token in either mode (the
    page asks for one and sends it with the overview); changing them still needs one."""
    status, body = await c.call("GET", path)
    assert status == 200 and body
    assert (await c.call("DELETE", path))[0] == 401
    assert (await c.call("DELETE", path, who="viewer"))[0] == 403
    return body


async def index(c: Caller, mode: str) -> None:
    body = await page_file(c, "/")
    assert b"<html" in body.lower() and b'id="auth"' in body


async def static(c: Caller, mode: str) -> None:
    assert b"Authorization" in await page_file(c, "/static/app.js")
    await page_file(c, "/static/style.css")
    assert (await c.call("GET", "/static/nope.js", who=reader(mode)))[0] == 404
    if mode == "authorized":  # another name is not one of the page's files
        assert (await c.call("GET", "/static/nope.js"))[0] == 401


async def overview(c: Caller, mode: str) -> None:
    status, body = await c.call("GET", "/api/v1/overview", who=reader(mode))
    assert status == 200 and isinstance(msgspec.json.decode(body), dict)
    await refused_without_token(c, mode, "GET", "/api/v1/overview")


async def stream(c: Caller, _mode: str) -> None:
    assert await c.stream("agent") == Ack(seq=0)
    refused = await c.stream("forged")
    assert isinstance(refused, Error) and refused.code == ErrorCode.UNAUTHENTICATED
    # not a WebSocket upgrade
    assert (await c.call("GET", "/v1/stream"))[0] == 400


async def extender_filter(c: Caller, _mode: str) -> None:
    path = "/scheduler/filter"
    args = {"Pod": POD, "NodeNames": [c.node, "unknown-node"]}
    status, body = await c.call("POST", path, data=msgspec.json.encode(args))
    assert status == 200
    assert msgspec.json.decode(body)["NodeNames"] == [c.node, "unknown-node"]
    status, body = await c.call("POST", path, data=b"{not json")
    assert status == 200 and "invalid ExtenderArgs" in msgspec.json.decode(body)["Error"]
    # Full Node objects (nodeCacheCapable: false): over http.max_body_bytes, within the
    # extender's own limit, answered in full.
    items = full_nodes(5000)
    big = msgspec.json.encode({"Pod": POD, "Nodes": {"items": items}})
    assert HTTP_BODY_BYTES < len(big) <= EXTENDER_BODY_BYTES
    status, body = await c.call("POST", path, data=big)
    assert status == 200 and len(msgspec.json.decode(body)["Nodes"]["items"]) == 5000
    status, body = await c.call("POST", path, data=b"x" * (EXTENDER_BODY_BYTES + 1))
    assert status == 413 and msgspec.json.decode(body)["error"] == "request_too_large"


async def extender_prioritize(c: Caller, _mode: str) -> None:
    path = "/scheduler/prioritize"
    args = {"Pod": POD, "NodeNames": ["unknown-node"]}
    status, body = await c.call("POST", path, data=msgspec.json.encode(args))
    assert status == 200
    assert msgspec.json.decode(body) == [{"Host": "unknown-node", "Score": 5}]
    status, body = await c.call("POST", path, data=b"[1, 2")
    assert status == 400 and b"invalid ExtenderArgs" in body


ROUTES: dict[tuple[str, str], Check] = {
    ("GET", "/metrics"): metrics,
    ("GET", "/healthz"): probe("/healthz", "ok"),
    ("GET", "/readyz"): probe("/readyz", "leader"),
    ("GET", "/readyz/replica"): probe("/readyz/replica", "ok"),
    ("GET", "/api/v1/fleet"): fleet,
    ("GET", "/api/v1/incidents"): incidents,
    ("GET", "/api/v1/breaker"): breaker,
    ("POST", "/api/v1/breaker/reset"): breaker_reset,
    ("GET", "/"): index,
    ("GET", "/static/{name}"): static,
    ("GET", "/api/v1/overview"): overview,
    ("GET", "/v1/stream"): stream,
    ("POST", "/scheduler/filter"): extender_filter,
    ("POST", "/scheduler/prioritize"): extender_prioritize,
}


async def composed_routes(kube: Cluster, overrides: dict[str, Any]) -> set[tuple[str, str]]:
    """(method, path) of every route of the application ``build_controller`` composes for
    this configuration (HEAD routes aiohttp adds beside GET left out)."""
    release = await kube.release()
    local = {"kubeconfig": str(release.kubeconfig), "leader": {"service": ""}}  # as the process
    data = merge(merge(release.config, local), overrides)
    cfg = load_config(None, data)
    api = await make_api_client(cfg.kubeconfig)
    try:
        app = build_controller(cfg, api).web_app()
        return {
            (r.method, r.resource.canonical)
            for r in app.router.routes()
            if r.method != "HEAD" and r.resource is not None
        }
    finally:
        await api.close()


@asynccontextmanager
async def metrics_reader(kube: Cluster, namespace: str, account: str) -> AsyncIterator[None]:
    """``get /metrics`` for the ServiceAccount, as Prometheus' usual ClusterRole grants it;
    removed afterwards (cluster-scoped)."""
    name = f"gpuhealth-test-metrics-{uuid.uuid4().hex[:6]}"
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    }
    created = []
    try:
        for kind, body in (("clusterroles", role), ("clusterrolebindings", binding)):
            await request(kube.api, "POST", f"{RBAC}/{kind}", body=body)
            created.append(f"{RBAC}/{kind}/{name}")
        yield
    finally:
        for path in reversed(created):
            await request(kube.api, "DELETE", path)


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[Cluster]:
    async with cluster(control_plane) as c:
        yield c


def token_of(kubeconfig: Path) -> str:
    return str(yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"])


@pytest.mark.parametrize("mode", ["open", "authorized"])
async def test_every_route_through_the_assembled_controller(
    mode: str,
    kube: Cluster,
    control_plane: ControlPlane,
    tmp_path: Path,
    unique_name: Callable[[str], str],
) -> None:
    overrides = merge(OVERRIDES, {"http": {"auth": {"reads": mode}}})
    assert await composed_routes(kube, overrides) == set(ROUTES)

    release = await kube.release()
    node = await kube.node(unique_name("gpu"))
    _, agent = await kube.agent(node)
    tokens = {"agent": agent, "forged": "not-a-token"}
    for who, role in (("operator", "operator"), ("viewer", "viewer")):
        tokens[who] = token_of(await release.user(control_plane, kube.api, who, role=role))
    tokens["scraper"] = token_of(await release.user(control_plane, kube.api, "scraper"))

    async with (
        metrics_reader(kube, release.namespace, "scraper"),
        controller_process(kube, tmp_path, overrides) as (_, base),
        aiohttp.ClientSession() as http,
    ):
        c = Caller(http, base, tokens, node)

        async def leading() -> bool:
            return (await c.call("GET", "/readyz"))[0] == 200

        await until(leading, "the controller to lead", timeout_s=30, interval_s=0.1)
        for (method, path), check in ROUTES.items():
            try:
                await check(c, mode)
            except AssertionError as exc:
                raise AssertionError(f"{method} {path} ({mode}): {exc}") from exc
        assert (await c.call("GET", "/no/such/route", who=reader(mode)))[0] == 404
        status, text = await c.call("GET", "/metrics", who=scraper(mode))
    assert status == 200
    # every extender call above was counted by its result
    found = text.decode()
    for verb, result, n in (
        ("filter", "ok", 2),
        ("filter", "bad_request", 1),
        ("prioritize", "ok", 1),
        ("prioritize", "bad_request", 1),
    ):
        line = f'gpuhealth_extender_requests_total{{result="{result}",verb="{verb}"}} {n:.1f}'
        assert line in found, line
    assert 'gpuhealth_http_connections_closed_total{reason="body_too_large"} 2.0' in found
