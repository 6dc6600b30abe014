"""Parsers on the controller's edges: taint annotations (fuzzed), Node JSON, watch lines,
DRA ResourceSlice matching, rule names, and the configuration file."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.common.errors import ConfigError
from gpuhealth.controller.config import load_config
from gpuhealth.controller.kube.dra import devices_by_uuid, label_value, rule_name
from gpuhealth.controller.kube.nodes import node_view
from gpuhealth.controller.kube.rest import GoneError
from gpuhealth.controller.kube.watch import NodeCache, newer
from gpuhealth.controller.plan import parse_taints, render_taints
from gpuhealth.controller.policy import NodeCondition, Taint

KEY = st.from_regex(
    r"[a-z0-9]([a-z0-9.-]{0,20}[a-z0-9])?/[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True
)
VALUE = st.from_regex(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,20}[A-Za-z0-9])?)?", fullmatch=True)
EFFECT = st.sampled_from(["NoSchedule", "PreferNoSchedule", "NoExecute"])


@given(st.sets(st.builds(Taint, KEY, VALUE, EFFECT), max_size=6))
def test_taint_annotation_round_trips(taints: set[Taint]) -> None:
    assert parse_taints(render_taints(taints)) == taints


@given(st.text(max_size=300))
def test_taint_annotation_never_crashes(text: str) -> None:
    for t in parse_taints(text):
        assert t.key and t.effect


def test_node_view_parses_the_wire_format() -> None:
    obj = {
        "metadata": {"name": "n1", "resourceVersion": "7", "labels": {"a": "b"}},
        "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]},
        "status": {
            "capacity": {"nvidia.com/gpu": "8"},
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "GPUHealthy", "status": "False", "reason": "XidError", "message": "m"},
            ],
        },
    }
    v = node_view(obj)
    assert (v.name, v.resource_version, v.gpus, dict(v.labels)) == ("n1", "7", 8, {"a": "b"})
    assert v.taints == ({"key": "k", "effect": "NoSchedule"},)
    assert v.condition == NodeCondition("False", "XidError", "m")
    bare = node_view({"metadata": {"name": "x"}})
    assert bare.gpus == 0 and bare.taints == () and bare.condition is None
    assert node_view({"metadata": {}, "status": {"capacity": {"nvidia.com/gpu": "2k"}}}).gpus == 0


@pytest.mark.parametrize(
    ("a", "b", "out"), [("10", "9", True), ("9", "10", False), ("5", "5", False), ("x", "y", True)]
)
def test_resource_version_order(a: str, b: str, out: bool) -> None:
    assert newer(a, b) is out


def test_watch_error_410_is_gone() -> None:
    cache = NodeCache(api=None)  # type: ignore[arg-type]
    with pytest.raises(GoneError):
        cache._on_line(
            b'{"type":"ERROR","object":{"kind":"Status","code":410,"message":"too old"}}'
        )
    cache._on_line(b'{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"55"}}}')
    assert cache.resource_version == "55"
    seen: list[str] = []
    cache.subscribe(lambda change, old, new: seen.append(change))
    cache._on_line(b'{"type":"ADDED","object":{"metadata":{"name":"n","resourceVersion":"56"}}}')
    cache._on_line(b'{"type":"MODIFIED","object":{"metadata":{"name":"n","resourceVersion":"56"}}}')
    cache._on_line(b'{"type":"MODIFIED","object":{"metadata":{"name":"n","resourceVersion":"57"}}}')
    cache._on_line(b'{"type":"DELETED","object":{"metadata":{"name":"n","resourceVersion":"58"}}}')
    assert seen == ["added", "modified", "deleted"]
    assert cache.get("n") is None


def test_devices_by_uuid_v1_and_v1beta1_layouts() -> None:
    slices = [
        {
            "spec": {
                "driver": "gpu.nvidia.com",
                "pool": {"name": "p1"},
                "devices": [
                    {"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-a"}}},
                    {"name": "gpu-1", "attributes": {"gpu.nvidia.com/uuid": {"string": "GPU-b"}}},
                    {"name": "gpu-2", "attributes": {"index": {"int": 2}}},
                ],
            }
        },
        {
            "spec": {
                "driver": "gpu.nvidia.com",
                "pool": {"name": "p2"},
                "devices": [
                    {"name": "gpu-9", "basic": {"attributes": {"uuid": {"string": "GPU-c"}}}}
                ],
            }
        },
    ]
    refs = devices_by_uuid(slices, "uuid")
    assert {u: (r.pool, r.device) for u, r in refs.items()} == {
        "GPU-a": ("p1", "gpu-0"),
        "GPU-b": ("p1", "gpu-1"),
        "GPU-c": ("p2", "gpu-9"),
    }


def test_rule_names_and_label_values_are_valid() -> None:
    assert rule_name("node-1", "GPU-ABC") == "gpuhealth-node-1-gpu-abc"
    long = rule_name("n" * 250, "GPU-1")
    assert len(long) <= 253 and long.startswith("gpuhealth-")
    assert label_value("node-1") == "node-1"
    assert len(label_value("n" * 100)) <= 63


def test_config_file_and_flags(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("breaker:\n  max_fraction: 0.2\npolicy:\n  noexecute_codes: [xid-79]\n")
    cfg = load_config(str(f), {"dry_run": True, "listen": None})
    assert cfg.breaker.max_fraction == 0.2 and cfg.breaker.window_s == 600.0
    assert cfg.policy.noexecute_codes == ("xid-79",)
    assert cfg.dry_run and cfg.listen == "0.0.0.0:8080"


@pytest.mark.parametrize(
    "text",
    [
        "nope: 1\n",
        "breaker:\n  max_fraction: 2\n",
        "reconciler:\n  workers: 0\n",
        "leader:\n  lease_duration_s: 5\n  renew_deadline_s: 10\n",
        "- a list\n",
        "prefix: a/b\n",
    ],
)
def test_bad_config_is_a_config_error(tmp_path: Path, text: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError):
        load_config(str(f))


def test_missing_config_file() -> None:
    with pytest.raises(ConfigError, match=r"nope\.yaml"):
        load_config("/nonexistent/nope.yaml")
