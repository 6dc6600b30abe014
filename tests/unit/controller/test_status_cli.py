"""``gpuhealth-controller status``: table rendering, ordering and exit codes (pure)."""

from __future__ import annotations

import http.server
import json
import socket
import ssl
import threading
from pathlib import Path
from typing import Any

import pytest
import trustme
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.controller import status_cli
from gpuhealth.controller.status_cli import (
    EXIT_OK,
    EXIT_UNHEALTHY,
    EXIT_UNREACHABLE,
    FleetUnavailable,
    checked,
    exit_code,
    gpu_reasons,
    node_row,
    render_table,
    sort_nodes,
)

XID79 = {
    "reason": "XidError",
    "code": "xid-79",
    "severity": "unhealthy",
    "message": "GPU has fallen off the bus.",
    "action": "RESTART_BM",
    "xid": 79,
}
HOT = {
    "reason": "Thermal",
    "code": "thermal",
    "severity": "degraded",
    "message": "",
    "action": "NONE",
}


def gpu(index: int, state: str = "healthy", *conds: dict[str, Any]) -> dict[str, Any]:
    return {"index": index, "uuid": f"GPU-{index}", "state": state, "conditions": list(conds)}


def node(name: str, state: str, gpus: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    return {"name": name, "state": state, "connected": True, "gpus": gpus, "taints": [], **kw}


FLEET = {
    "nodes": [
        node("gpu-node-0", "healthy", [gpu(0), gpu(1)]),
        node("gpu-node-1", "degraded", [gpu(0, "degraded", HOT), gpu(1)]),
        node(
            "gpu-node-2",
            "unhealthy",
            [gpu(0), gpu(3, "unhealthy", XID79)],
            taints=[{"key": "gpuhealth.io/unhealthy", "value": "xid-79", "effect": "NoSchedule"}],
        ),
        node("gpu-node-3", "unknown", [], connected=False),
    ],
    "breaker": {"open": False},
}


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        ([], EXIT_OK),
        (["healthy", "healthy"], EXIT_OK),
        (["healthy", "degraded", "unknown"], EXIT_OK),
        (["healthy", "unhealthy"], EXIT_UNHEALTHY),
        (["unhealthy"], EXIT_UNHEALTHY),
    ],
)
def test_exit_code(states: list[str], expected: int) -> None:
    fleet = {"nodes": [node(f"n{i}", s, []) for i, s in enumerate(states)]}
    assert exit_code(fleet) == expected


def test_unhealthy_first_then_unknown_degraded_healthy() -> None:
    order = [n["name"] for n in sort_nodes(FLEET["nodes"])]
    assert order == ["gpu-node-2", "gpu-node-3", "gpu-node-1", "gpu-node-0"]


@pytest.mark.parametrize(
    ("g", "expected"),
    [
        (gpu(3, "unhealthy", XID79), "GPU 3 xid-79 GPU has fallen off the bus (RESTART_BM)"),
        (gpu(1, "degraded", HOT), "GPU 1 thermal"),
        (gpu(2, "unknown"), "GPU 2 unknown"),
    ],
)
def test_gpu_reasons(g: dict[str, Any], expected: str) -> None:
    assert gpu_reasons(g) == expected


def test_node_row_counts_healthy_gpus_and_taints() -> None:
    row = node_row(FLEET["nodes"][2])
    assert row[:4] == ("gpu-node-2", "unhealthy", "1/2", "gpuhealth.io/unhealthy=xid-79:NoSchedule")
    assert "RESTART_BM" in row[4]
    assert node_row(FLEET["nodes"][3])[1:3] == ("unknown (agent not connected)", "-")


def test_table_is_aligned_and_summarised() -> None:
    lines = render_table(FLEET).splitlines()
    assert lines[0].split() == ["NODE", "STATE", "HEALTHY", "TAINTS", "REASONS", "(ACTION)"]
    assert lines[1].startswith("gpu-node-2  unhealthy")
    col = lines[0].index("STATE")
    assert all(line[col - 2 : col] == "  " for line in lines[1:5])
    assert lines[-1] == "4 nodes: 1 unhealthy, 1 unknown, 1 degraded, 1 healthy"


def test_summary_flags_open_breaker_and_dry_run() -> None:
    fleet = {**FLEET, "breaker": {"open": True}, "dry_run": True}
    assert render_table(fleet).splitlines()[-1].endswith("[circuit breaker OPEN; dry run]")


REMEDIATION = {
    "pipeline": {"Pending": 1, "Draining": 1, "Escalated": 1, "Returned": 4},
    "total": 9,
    "episodes": [
        {"name": "gpu-node-2-1a2b", "node": "gpu-node-2", "phase": "Draining",
         "action": "reset-gpu", "reason": "Draining", "in_phase_s": 75.0, "age_s": 400.0,
         "evicted": 3},
        {"name": "gpu-node-7-9f9f", "node": "gpu-node-7", "phase": "Escalated",
         "action": "escalate", "reason": "ContactSupport", "in_phase_s": 9000.0,
         "age_s": 9100.0, "evicted": 0},
    ],
}  # fmt: skip


def test_episodes_follow_the_fleet_with_the_pipeline() -> None:
    lines = render_table({**FLEET, "remediation": REMEDIATION}).splitlines()
    at = lines.index("4 nodes: 1 unhealthy, 1 unknown, 1 degraded, 1 healthy")
    assert lines[at + 1] == ""
    assert lines[at + 2] == (
        "remediation: Pending 1 → Quarantined 0 → Draining 1 → Remediating 0 → Validating 0 → "
        "Returned 4 | Escalated 1, Failed 0"
    )
    head, first, second, more = lines[at + 3 :]
    assert head.split() == [
        "NODE", "PHASE", "ACTION", "REASON", "IN", "PHASE", "AGE", "EVICTED", "EPISODE",
    ]  # fmt: skip
    assert first.split() == [
        "gpu-node-2", "Draining", "reset-gpu", "Draining", "75s", "6m", "3", "gpu-node-2-1a2b",
    ]  # fmt: skip
    assert second.split()[:6] == ["gpu-node-7", "Escalated", "escalate", "ContactSupport",
                                  "2h30m", "2h31m"]  # fmt: skip
    assert first.index("Draining") == head.index("PHASE")
    assert more == "(7 older episodes not shown)"


def test_no_remediation_section_when_the_loop_is_off() -> None:
    text = render_table({**FLEET, "remediation": None})
    assert "remediation" not in text and text == render_table(FLEET)


def test_unreachable_controller_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:  # a port nobody listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        code = status_cli.main(["--url", f"http://127.0.0.1:{port}", "--timeout", "0.5"])
    assert code == EXIT_UNREACHABLE
    assert "cannot read" in capsys.readouterr().err


class _Fleet(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps(FLEET).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_an_https_controller_is_verified_with_the_ca_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The chart serves TLS by default: ``--ca-file`` trusts its CA (an operator's
    port-forward reaches it as localhost); without it the certificate is refused."""
    ca = trustme.CA()
    server = http.server.HTTPServer(("127.0.0.1", 0), _Fleet)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(ctx)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    ca.cert_pem.write_to_path(str(tmp_path / "ca.crt"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"https://localhost:{server.server_address[1]}"
    try:
        assert status_cli.main(["--url", url, "--ca-file", str(tmp_path / "ca.crt")]) == 1
        assert "gpu-node-2" in capsys.readouterr().out
        assert status_cli.main(["--url", url, "--timeout", "5"]) == EXIT_UNREACHABLE
        assert "CERTIFICATE_VERIFY_FAILED" in capsys.readouterr().err
    finally:
        server.shutdown()
        server.server_close()


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
NODE = st.fixed_dictionaries(
    {},
    optional={
        "name": JSON, "state": JSON, "connected": JSON, "silent": JSON,
        "gpus": st.lists(st.fixed_dictionaries({}, optional={
            "index": JSON, "state": JSON, "conditions": st.lists(JSON, max_size=3) | JSON,
        }) | JSON, max_size=3),
        "taints": st.lists(JSON, max_size=3) | JSON,
    },
)  # fmt: skip


EPISODES = st.fixed_dictionaries(
    {},
    optional={
        "pipeline": JSON, "total": JSON,
        "episodes": st.lists(st.fixed_dictionaries({}, optional={
            k: JSON for k in ("name", "node", "phase", "action", "reason", "in_phase_s",
                              "age_s", "evicted")
        }) | JSON, max_size=3) | JSON,
    },
)  # fmt: skip


@given(
    st.dictionaries(st.text(max_size=8), JSON, max_size=3),
    st.lists(NODE | JSON, max_size=4),
    EPISODES | JSON,
)
def test_any_document_renders_or_is_refused(
    extra: dict[str, Any], nodes: list[Any], remediation: Any
) -> None:
    """Whatever a (broken) controller answers, the CLI prints a table or says why not."""
    for doc in (
        extra,
        {**extra, "nodes": nodes},
        {**extra, "nodes": [], "remediation": remediation},
    ):
        try:
            fleet = checked(doc, "test")
        except FleetUnavailable:
            continue
        assert isinstance(render_table(fleet), str)
        assert exit_code(fleet) in (EXIT_OK, EXIT_UNHEALTHY)


def test_controller_cli_dispatches_status(capsys: pytest.CaptureFixture[str]) -> None:
    from gpuhealth.controller import cli

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        code = cli.main(["status", "--url", f"http://127.0.0.1:{port}", "--timeout", "0.5"])
    assert code == EXIT_UNREACHABLE
    assert "gpuhealth-controller status: cannot read" in capsys.readouterr().err


async def test_status_follows_continue_tokens_of_the_real_fleet_api() -> None:
    """Against the controller's own handlers: 25 nodes in pages of 10 are three compressed
    requests, and the table has every node once, in the fleet's order."""
    import asyncio

    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from gpuhealth.controller.breaker.gate import CircuitBreaker
    from gpuhealth.controller.breaker.settings import BreakerSettings
    from gpuhealth.controller.fleet.cache import FleetCache
    from gpuhealth.controller.fleet.model import Fleet
    from gpuhealth.controller.http.api import ApiV1, node_fragment
    from gpuhealth.controller.names import Keys
    from tests.support.clock import FakeClock
    from tests.support.fleet import connect, send_transition
    from tests.support.nodes import FakeNodeCache
    from tests.support.protocol import XID79

    clock = FakeClock()
    fleet, nodes = Fleet(clock=clock), FakeNodeCache()
    for i in range(25):
        connect(fleet, f"gpu-node-{i}", 2)
    send_transition(fleet, "gpu-node-17", 1, "unhealthy", XID79)
    breaker = CircuitBreaker(BreakerSettings(), clock)
    api = ApiV1(
        cache=FleetCache(fleet, nodes, Keys("gpuhealth.io"), node_fragment),
        breaker_status=breaker.status,
        reset_breaker_and_requeue=list,
        is_leader=lambda: True,
        dry_run=False,
        clock=clock,
    )
    seen: list[tuple[str, str]] = []

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        response: web.StreamResponse = await handler(request)
        seen.append((request.query_string, response.headers.get("Content-Encoding", "")))
        return response

    app = web.Application(middlewares=[record])
    app.add_routes(api.routes())
    async with TestServer(app) as server:
        url = str(server.make_url("/"))
        doc = await asyncio.to_thread(status_cli.fetch_fleet, url, 5.0, None, page_limit=10)
    names = [n["name"] for n in doc["nodes"]]
    assert names == [f"gpu-node-{i}" for i in range(25)]
    assert len(seen) == 3 and all(enc == "gzip" for _, enc in seen)
    assert "continue=" not in seen[0][0] and "continue=" in seen[2][0]
    assert status_cli.exit_code(doc) == status_cli.EXIT_UNHEALTHY
    assert render_table(doc).splitlines()[1].startswith("gpu-node-17")


@pytest.mark.parametrize(
    ("incident", "shown"),
    [
        ({"state": "open", "paging": "paging"}, "paging"),
        ({"state": "closed"}, "closed"),
        (
            {
                "state": "open",
                "lifecycle": {"acknowledged": {"by": "alice", "applied": True}},
            },
            "ack by alice",
        ),
        (
            {
                "state": "open",
                "lifecycle": {
                    "acknowledged": {"by": "alice", "applied": True},
                    "silenced": {"by": "bob", "until": "T", "applied": True},
                },
            },
            "silenced by bob until T; ack by alice",
        ),
        (
            {"state": "open", "lifecycle": {"acknowledged": {"by": "old", "applied": False}}},
            "paging",
        ),
        (
            {"state": "closed", "lifecycle": {"resolved": {"by": "carol", "applied": True}}},
            "resolved by carol",
        ),
    ],
)
def test_on_calls_part_of_an_incident(incident: dict[str, object], shown: str) -> None:
    from gpuhealth.controller.status_cli import on_call

    assert on_call(incident) == shown
