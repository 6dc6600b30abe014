"""The table of who may call which controller endpoint (controller/http/access.py)."""

from __future__ import annotations

import pytest

from gpuhealth.controller.http.access import (
    AccessRequirement,
    PathAccess,
    ResourceAccess,
    required_access,
)

NS = "gpuhealth"
RESET = AccessRequirement("operator", ResourceAccess("update", "circuitbreakers", NS))
FLEET = AccessRequirement("read", ResourceAccess("get", "fleet", NS))
HANDOFF = AccessRequirement("replica", ResourceAccess("create", "shardreports", NS))


def other(verb: str, path: str) -> AccessRequirement:
    return AccessRequirement("other", PathAccess(verb, path))


@pytest.mark.parametrize(
    ("method", "path", "reads", "want"),
    [
        ("POST", "/api/v1/breaker/reset", False, RESET),
        ("POST", "/api/v1/breaker/reset", True, RESET),
        ("post", "/api/v1/breaker/reset", False, RESET),
        # every other state-changing request is closed, by its non-resource URL
        (
            "DELETE",
            "/api/v1/fleet",
            False,
            other("delete", "/api/v1/fleet"),
        ),
        (
            "PUT",
            "/api/v1/breaker",
            False,
            other("update", "/api/v1/breaker"),
        ),
        ("PATCH", "/x", False, other("patch", "/x")),
        (
            "POST",
            "/api/v1/clear",
            False,
            other("create", "/api/v1/clear"),
        ),
        ("BREW", "/x", False, other("brew", "/x")),
        # past one process, the owners' job handoffs: the replicas' own verb
        ("POST", "/api/v1/shards/reports", False, HANDOFF),
        ("POST", "/api/v1/shards/attempts", True, HANDOFF),
        ("PUT", "/api/v1/shards/reports", False, other("update", "/api/v1/shards/reports")),
        # reads: authorized by default, open on demand
        ("GET", "/api/v1/fleet", False, None),
        ("GET", "/api/v1/fleet", True, FLEET),
        ("GET", "/api/v1/incidents", True, FLEET),
        ("GET", "/api/v1/overview", True, FLEET),
        # the status page's own files hold no data: open (the page asks for a token)
        ("GET", "/", True, None),
        ("GET", "/static/app.js", True, None),
        ("GET", "/static/style.css", True, None),
        ("GET", "/static/other.js", True, FLEET),
        ("GET", "//", True, FLEET),
        ("HEAD", "/api/v1/breaker", True, FLEET),
        ("GET", "/metrics", False, None),
        ("GET", "/metrics", True, AccessRequirement("metrics", PathAccess("get", "/metrics"))),
        # always open: probes, the stream (own auth), the scheduler extender
        ("GET", "/healthz", True, None),
        ("GET", "/readyz", True, None),
        ("GET", "/readyz/replica", True, None),
        ("GET", "/v1/stream", True, None),
        ("POST", "/scheduler/filter", True, None),
        ("POST", "/scheduler/prioritize", False, None),
    ],
)
def test_required_access(
    method: str, path: str, reads: bool, want: AccessRequirement | None
) -> None:
    assert required_access(method, path, reads_authorized=reads, namespace=NS) == want


def test_attributes_are_those_of_a_subject_access_review() -> None:
    assert RESET.access.attributes() == {
        "verb": "update",
        "group": "gpuhealth.io",
        "resource": "circuitbreakers",
        "namespace": NS,
    }
    assert PathAccess("get", "/metrics").attributes() == {"verb": "get", "path": "/metrics"}
    assert "update circuitbreakers.gpuhealth.io" in RESET.access.describe()


def test_fleet_reads_are_authorized_by_default() -> None:
    from gpuhealth.controller.http.settings import HttpAuthSettings

    assert HttpAuthSettings().reads == "authorized"
