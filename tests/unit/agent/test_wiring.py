"""What the composition root does at start besides wiring: the XID catalog is loaded then (the
first XID must not pay for it), and a configuration blind to some XIDs says so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from gpuhealth.agent.exposition import render
from gpuhealth.agent.health import xid_catalog
from gpuhealth.agent.metrics import make_registry
from gpuhealth.agent.settings import load_config
from gpuhealth.agent.wiring import build_agent
from tests.support.clock import FakeClock


def _build(tmp_path: Path, **overrides: Any) -> Any:
    base = {"node_name": "n", "state_dir": str(tmp_path), "podresources": {"enabled": False}}
    cfg = load_config(None, {**base, **overrides})
    return build_agent(cfg, clock=FakeClock(), sources=(), boot_id="b")


def _unobservable(app: Any) -> list[str]:
    text = render(make_registry(app.state.snapshot, "t", app.stats)).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    return sorted(s.labels["xid"] for s in fams["gpuhealth_agent_xid_unobservable"].samples)


def test_the_catalog_is_loaded_at_start(tmp_path: Path) -> None:
    xid_catalog._loaded.cache_clear()
    _build(tmp_path, kmsg_path="none", source="sim")
    assert xid_catalog._loaded.cache_info().currsize == 1


@pytest.mark.parametrize("source", ["nvml", "dcgm-exporter"])
def test_nvml_without_the_kernel_log_warns_and_exports_the_blind_xids(
    tmp_path: Path, source: str
) -> None:
    with capture_logs() as logs:
        app = _build(tmp_path, kmsg_path="none", source=source)
    warned = [e for e in logs if e["event"] == "kernel_log_off"]
    assert len(warned) == 1 and warned[0]["log_level"] == "warning"
    assert warned[0]["unobservable_xids"] == [79, 119, 120]
    assert _unobservable(app) == ["119", "120", "79"]


@pytest.mark.parametrize(
    ("source", "kmsg"), [("nvml", "/dev/kmsg"), ("sim", "none"), ("dcgm-exporter", "/x.log")]
)
def test_no_warning_when_every_xid_is_observable(tmp_path: Path, source: str, kmsg: str) -> None:
    with capture_logs() as logs:
        app = _build(tmp_path, kmsg_path=kmsg, source=source)
    assert not [e for e in logs if e["event"] == "kernel_log_off"]
    assert _unobservable(app) == []


def test_the_stream_dials_the_shard_of_its_node_name(tmp_path: Path) -> None:
    from gpuhealth.protocol.shards import shard_of

    token = tmp_path / "token"
    token.write_text("t")
    url = "ws://gh-controller-shard-{shard}.ns.svc:8080/v1/stream"
    app = _build(
        tmp_path,
        node_name="gpu-node-7",
        source="sim",
        kmsg_path="none",
        controller_url=url,
        controller_shards=5,
        token_file=str(token),
    )
    try:
        shard = shard_of("gpu-node-7", 5)
        assert app.parts.stream.route.url == url.replace("{shard}", str(shard))
        stream = app.parts.stream.metrics
        text = render(make_registry(app.state.snapshot, "t", app.stats, stream)).decode()
        assert f"gpuhealth_agent_stream_shard {float(shard)}" in text
    finally:
        app.parts.outbox.close()
        app.parts.store.close()
