"""The node watch cache's pure parts: resourceVersion order, a watch error line."""

from __future__ import annotations

import pytest

from gpuhealth.controller.kube.informer import newer
from gpuhealth.controller.kube.node_cache import NodeCache
from gpuhealth.controller.kube.rest import GoneError


@pytest.mark.parametrize(
    ("a", "b", "out"), [("10", "9", True), ("9", "10", False), ("5", "5", False), ("x", "y", True)]
)
def test_resource_version_order(a: str, b: str, out: bool) -> None:
    assert newer(a, b) is out


def test_watch_error_410_is_gone() -> None:
    cache = NodeCache(api=None)  # type: ignore[arg-type]
    with pytest.raises(GoneError):
        cache.informer.on_line(
            b'{"type":"ERROR","object":{"kind":"Status","code":410,"message":"too old"}}'
        )
    cache.informer.on_line(b'{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"55"}}}')
    assert cache.resource_version == "55"
    seen: list[str] = []
    cache.subscribe(lambda change, old, new: seen.append(change))
    cache.informer.on_line(
        b'{"type":"ADDED","object":{"metadata":{"name":"n","resourceVersion":"56"}}}'
    )
    cache.informer.on_line(
        b'{"type":"MODIFIED","object":{"metadata":{"name":"n","resourceVersion":"56"}}}'
    )
    cache.informer.on_line(
        b'{"type":"MODIFIED","object":{"metadata":{"name":"n","resourceVersion":"57"}}}'
    )
    cache.informer.on_line(
        b'{"type":"DELETED","object":{"metadata":{"name":"n","resourceVersion":"58"}}}'
    )
    assert seen == ["added", "modified", "deleted"]
    assert cache.get("n") is None
