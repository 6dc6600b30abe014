"""Operators' endpoints against the real kube-apiserver: the breaker reset answers only a
caller whose bearer token is valid (TokenReview) and who may ``update
circuitbreakers.gpuhealth.io`` in the controller's namespace (SubjectAccessReview), granted by
the chart's operator Role; ``gpuhealth-controller breaker reset`` does it with the operator's
kubeconfig. The controller itself runs with the chart's ServiceAccount and RBAC."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client import generate_latest

from gpuhealth.controller.app import Controller
from gpuhealth.controller.settings import load_config
from localkube import ControlPlane
from tests.integration.chromium_support import dump_dom
from tests.integration.controller_helpers import Cluster, cluster, get_node, our_taints
from tests.support.fleet import connect
from tests.support.protocol import fault
from tests.support.wait import until

pytestmark = pytest.mark.integration


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[Cluster]:
    async with cluster(control_plane) as c:
        yield c


async def controller_cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """``gpuhealth-controller <args>``: exit status, stdout, stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpuhealth.controller.cli",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def breaker_cli(*args: str) -> tuple[int, str, str]:
    return await controller_cli("breaker", *args)


def auth_count(ctl: Controller, rule: str, result: str) -> float:
    text = generate_latest(ctl.parts.registry).decode()
    line = f'gpuhealth_http_auth_total{{result="{result}",rule="{rule}"}} '
    found = [ln for ln in text.splitlines() if ln.startswith(line)]
    return float(found[0].split()[-1]) if found else 0.0


async def our_taints_of(kube: Cluster, node: str) -> bool:
    return bool(our_taints(await get_node(kube.api, node)))


async def serve(ctl: Controller) -> tuple[TestServer, str]:
    server = TestServer(ctl.web_app(), host="127.0.0.1", port=0)
    await server.start_server()
    return server, f"http://127.0.0.1:{server.port}"


async def test_only_an_operator_resets_the_breaker(
    kube: Cluster, unique_name: Callable[[str], str], control_plane: ControlPlane
) -> None:
    release = await kube.release()
    ops = await release.user(control_plane, kube.api, "ops", role="operator")
    viewer = await release.user(control_plane, kube.api, "dana", role="viewer")
    intruder = await release.user(control_plane, kube.api, "intruder")
    # one new taint allowed: the second faulty node opens the breaker
    ctl = await kube.controller({"breaker": {"max_fraction": 0.0, "min_nodes": 1}})
    first = await kube.node(unique_name("gpu-a"))
    connect(ctl.parts.fleet, first)
    ctl.parts.fleet.on_message(first, fault(first, 0))
    await until(lambda: our_taints_of(kube, first), "the first node tainted")
    node = await kube.node(unique_name("gpu-b"))
    connect(ctl.parts.fleet, node)
    ctl.parts.fleet.on_message(node, fault(node, 0))
    await until(lambda: ctl.parts.breaker.is_open, "the breaker open")
    server, base = await serve(ctl)
    try:
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{base}/api/v1/breaker/reset") as resp:
                assert resp.status == 401
                assert (await resp.json())["error"] == "unauthenticated"
            forged = {"Authorization": "Bearer not-a-token"}
            async with s.post(f"{base}/api/v1/breaker/reset", headers=forged) as resp:
                assert resp.status == 401
        assert ctl.parts.breaker.is_open

        for who in (intruder, viewer):  # valid tokens, but no right to reset
            rc, _, err = await breaker_cli("reset", "--url", base, "--kubeconfig", str(who))
            assert rc == 1, err
            assert "HTTP 403 forbidden" in err and "circuitbreakers.gpuhealth.io" in err
        assert ctl.parts.breaker.is_open
        # the admin's client certificate cannot be forwarded: no token, a usage error
        rc, _, err = await breaker_cli(
            "reset", "--url", base, "--kubeconfig", str(control_plane.kubeconfig)
        )
        assert rc == 2 and "no bearer token" in err

        rc, out, _ = await breaker_cli("status", "--url", base, "--kubeconfig", str(ops))
        assert rc == 1 and "circuit breaker OPEN" in out and node in out
        rc, out, err = await breaker_cli("reset", "--url", base, "--kubeconfig", str(ops))
        assert rc == 0, err
        assert "circuit breaker reset" in out and node in out
        await until(lambda: our_taints_of(kube, node), "the blocked node tainted after the reset")
        assert not ctl.parts.breaker.is_open
        rc, out, _ = await breaker_cli("status", "--url", base)  # FAST opens the reads
        assert rc == 0 and "circuit breaker closed" in out
    finally:
        await server.close()
    assert auth_count(ctl, "operator", "unauthenticated") == 2
    assert auth_count(ctl, "operator", "forbidden") == 2
    assert auth_count(ctl, "operator", "allowed") == 1


async def status_cli(*args: str, home: Path) -> tuple[int, str, str]:
    """``gpuhealth-controller status`` with no kubeconfig but the one given (``HOME`` moved)."""
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"} | {"HOME": str(home)}
    return await controller_cli("status", *args, env=env)


async def test_fleet_reads_are_authorized_by_default_and_the_page_and_cli_work_through_it(
    kube: Cluster, control_plane: ControlPlane, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    """The fleet lists every pod's GPU and incidents name jobs: by default (the chart's
    configuration too) every read needs a token that may ``get fleet.gpuhealth.io``, which
    the chart's viewer ClusterRole grants. The status page's own files stay open and the page
    sends the token it is given; ``gpuhealth-controller status`` sends the kubeconfig's."""
    release = await kube.release()
    assert load_config(None, release.config).http.auth.reads == "authorized"
    viewer = await release.user(control_plane, kube.api, "dana", role="viewer")
    intruder = await release.user(control_plane, kube.api, "intruder")
    tokens = {"viewer": viewer_token(viewer), "intruder": viewer_token(intruder)}
    ctl = await kube.controller({"http": {"auth": {"reads": "authorized"}}})  # as the chart's
    node = await kube.node(unique_name("gpu-r"))
    connect(ctl.parts.fleet, node)
    ctl.parts.fleet.on_message(node, fault(node, 0))
    server, base = await serve(ctl)
    try:
        async with aiohttp.ClientSession() as s:

            async def get(path: str, who: str | None = None) -> int:
                headers = {"Authorization": f"Bearer {tokens[who]}"} if who else {}
                async with s.get(base + path, headers=headers) as resp:
                    return resp.status

            for path in ("/api/v1/fleet", "/api/v1/overview", "/api/v1/incidents"):
                assert await get(path) == 401, path
                assert await get(path, "intruder") == 403, path
                assert await get(path, "viewer") == 200, path
            assert await get("/api/v1/breaker", "viewer") == 200
            assert await get("/metrics") == 401
            assert await get("/metrics", "viewer") == 403  # /metrics is its own grant
            for path in ("/", "/static/app.js", "/static/style.css"):  # no data: open
                assert await get(path) == 200, path
            assert await get("/healthz") == 200  # probes stay open
            assert await get("/readyz/replica") == 200

        # the CLI sends the kubeconfig's token
        rc, out, err = await status_cli("--url", base, "--kubeconfig", str(viewer), home=tmp_path)
        assert rc == 1, err  # a node is unhealthy
        assert node in out and "unhealthy" in out
        rc, _, err = await status_cli("--url", base, "--kubeconfig", str(intruder), home=tmp_path)
        assert rc == 3 and "HTTP 403" in err and "viewer ClusterRole" in err
        rc, _, err = await status_cli("--url", base, home=tmp_path)  # no kubeconfig at all
        assert rc == 3 and "HTTP 401" in err

        # the status page: asks for a token, then shows the fleet with it
        asking = await dump_dom(f"{base}/")
        assert 'id="auth"' in asking and 'data-status="401"' in asking
        assert re.search(r'<form id="auth"[^>]*hidden', asking) is None
        signed_in = await dump_dom(f"{base}/#token={tokens['viewer']}")
        assert node in signed_in and 'data-ok="true"' in signed_in
        assert re.search(r'<form id="auth"[^>]*hidden', signed_in) is not None
        refused = await dump_dom(f"{base}/#token={tokens['intruder']}")
        assert 'data-status="403"' in refused and node not in refused
    finally:
        await server.close()
    assert auth_count(ctl, "read", "allowed") >= 4
    assert auth_count(ctl, "read", "unauthenticated") >= 4
    assert auth_count(ctl, "read", "forbidden") >= 4


def viewer_token(kubeconfig: Path) -> str:
    import yaml

    doc: dict[str, Any] = yaml.safe_load(kubeconfig.read_text())
    return str(doc["users"][0]["user"]["token"])
