"""The extender's HTTP handlers: every request is answered and counted by its result, and
each failure is logged as a warning (kube-scheduler ignores an ignorable extender's errors,
so this is where a failing extender shows)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import pytest
from aiohttp.test_utils import TestClient, TestServer
from structlog.testing import capture_logs

from gpuhealth.controller.placement import ExtenderHandlers, ExtenderSettings, extender_app
from gpuhealth.controller.placement.view import NodeSummary, summarize

ARGS = msgspec.json.encode(
    {
        "Pod": {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]}},
        "NodeNames": ["a", "b"],
    }
)


class Summaries:
    """A summaries lookup that can be made to fail."""

    def __init__(self) -> None:
        self.fail = False
        self.nodes: dict[str, NodeSummary] = {"a": summarize("a", [], [], ExtenderSettings())}

    def __call__(self) -> dict[str, NodeSummary]:
        if self.fail:
            raise RuntimeError("index broken")
        return self.nodes


@pytest.fixture
async def served() -> AsyncIterator[tuple[TestClient[object, object], ExtenderHandlers, Summaries]]:
    lookup = Summaries()
    handlers = ExtenderHandlers(lookup, ExtenderSettings(max_body_bytes=2048))
    async with TestClient(TestServer(extender_app(handlers))) as client:
        yield client, handlers, lookup


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"{not json", "invalid ExtenderArgs"),
        (b'{"Pod": 3}', "invalid ExtenderArgs"),
        (b"x" * 2049, "request body larger than 2048 bytes"),
    ],
)
async def test_a_bad_request_is_answered_counted_and_logged(
    served: tuple[TestClient[object, object], ExtenderHandlers, Summaries], body: bytes, error: str
) -> None:
    client, handlers, _ = served
    with capture_logs() as logs:
        filtered = await client.post("/scheduler/filter", data=body)
        scored = await client.post("/scheduler/prioritize", data=body)
    assert filtered.status == 200
    assert error in msgspec.json.decode(await filtered.read())["Error"]
    assert scored.status == 400 and error in await scored.text()
    assert handlers.metrics.requests == {
        ("filter", "bad_request"): 1,
        ("prioritize", "bad_request"): 1,
    }
    warned = [e for e in logs if e["event"] == "extender_bad_request"]
    assert [e["verb"] for e in warned] == ["filter", "prioritize"]
    assert all(e["log_level"] == "warning" and error in e["error"] for e in warned)


async def test_a_failure_inside_the_extender_is_an_error_not_a_crash(
    served: tuple[TestClient[object, object], ExtenderHandlers, Summaries],
) -> None:
    client, handlers, lookup = served
    lookup.fail = True
    with capture_logs() as logs:
        filtered = await client.post("/scheduler/filter", data=ARGS)
        scored = await client.post("/scheduler/prioritize", data=ARGS)
    assert "index broken" in msgspec.json.decode(await filtered.read())["Error"]
    assert scored.status == 500
    assert handlers.metrics.requests == {("filter", "error"): 1, ("prioritize", "error"): 1}
    assert [e["event"] for e in logs] == ["extender_failed", "extender_failed"]
    lookup.fail = False
    ok = await client.post("/scheduler/filter", data=ARGS)
    # "a" has no GPU for the pod, "b" no agent: it passes
    assert msgspec.json.decode(await ok.read())["NodeNames"] == ["b"]
    assert handlers.metrics.requests["filter", "ok"] == 1
