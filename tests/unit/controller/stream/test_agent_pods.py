"""The agent-pod watch's bookkeeping: which events make a pod's tokens worthless, once."""

from __future__ import annotations

from typing import Any

import pytest

from gpuhealth.controller.stream.agent_pods import AgentPods, gone_reason


def pod(uid: str, name: str = "agent-x", **kw: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"uid": uid, "name": name, "resourceVersion": "1"}
    if kw.get("deleting"):
        meta["deletionTimestamp"] = "2026-11-22T10:00:00Z"
    return {
        "metadata": meta,
        "spec": {"nodeName": "node-x", "serviceAccountName": "gpuhealth-agent"},
        "status": {"phase": kw.get("phase", "Running")},
    }


@pytest.fixture
def pods() -> tuple[AgentPods, list[tuple[str, str]]]:
    p = AgentPods(None, "gpuhealth", "gpuhealth-agent")  # type: ignore[arg-type]
    heard: list[tuple[str, str]] = []
    p.subscribe(lambda uid, reason: heard.append((uid, reason)))
    return p, heard


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        (pod("u"), None),
        (pod("u", phase="Pending"), None),
        (pod("u", deleting=True), "terminating"),
        (pod("u", phase="Succeeded"), "finished"),
        (pod("u", phase="Failed"), "finished"),
    ],
)
def test_gone_reason(obj: dict[str, Any], reason: str | None) -> None:
    assert gone_reason(obj) == reason


def test_terminating_then_deleted_revokes_once(pods: tuple[AgentPods, list[Any]]) -> None:
    p, heard = pods
    p.apply("ADDED", pod("u1"))
    assert p.gone("u1") is None and not heard
    p.apply("MODIFIED", pod("u1", deleting=True))
    p.apply("DELETED", pod("u1", deleting=True))
    assert heard == [("u1", "terminating")] and p.gone("u1") == "terminating"
    p.apply("MODIFIED", pod("u1"))  # a late event never brings it back
    assert p.gone("u1") == "terminating"


def test_a_new_pod_of_the_same_name_replaces_the_old(pods: tuple[AgentPods, list[Any]]) -> None:
    p, heard = pods
    p.apply("ADDED", pod("u1", name="agent-a"))
    p.apply("ADDED", pod("u2", name="agent-a"))
    assert heard == [("u1", "replaced")]
    assert p.gone("u2") is None


def test_a_relist_revokes_pods_missed_while_the_watch_was_down(
    pods: tuple[AgentPods, list[Any]],
) -> None:
    p, heard = pods
    first: set[str] = set()
    p.listed([pod("u1", name="a"), pod("u2", name="b")], first)
    p.list_complete(first)
    second: set[str] = set()
    p.listed([pod("u2", name="b")], second)
    p.listed([pod("u3", name="c")], second)  # a second page
    assert heard == []  # nothing is gone before the LIST is complete
    p.list_complete(second)
    assert heard == [("u1", "deleted")]
    assert p.bound("u3") is not None and p.bound("u2") is not None


async def test_known_pods_are_answered_without_asking_the_api_server(
    pods: tuple[AgentPods, list[Any]],
) -> None:
    p, _ = pods  # api=None: any request would fail
    p.apply("ADDED", pod("u1"))
    p.apply("DELETED", pod("u2"))
    assert await p.alive("u1", "agent-x")
    assert not await p.alive("u2", "agent-x")
