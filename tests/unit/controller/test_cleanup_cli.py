"""``gpuhealth-controller cleanup``: what it cleans follows the controller's configuration."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuhealth.controller import cli
from gpuhealth.controller.cleanup_cli import parser, target_for
from gpuhealth.controller.settings import load_config


def test_target_follows_the_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    cfg = load_config(
        None,
        {
            "prefix": "gpu.example.com",
            "leader": {"namespace": "gpu-system", "lease_name": "l", "service": "svc"},
            "idle": {"annotate": True, "annotation_key": "gpu.example.com/idle-since"},
        },
    )
    t = target_for(cfg, parser().parse_args(["--stop-deployment", "ctl", "--keep-taints"]))
    assert (t.keys.prefix, t.namespace, t.deployment) == ("gpu.example.com", "gpu-system", "ctl")
    assert (t.lease, t.service, t.idle_annotation) == ("l", "svc", "gpu.example.com/idle-since")
    assert t.keep_taints

    monkeypatch.setenv("POD_NAMESPACE", "from-pod")
    plain = target_for(load_config(None, {"leader": {"enabled": False}}), parser().parse_args([]))
    assert (plain.namespace, plain.lease, plain.idle_annotation) == ("from-pod", "", "")
    assert not plain.keep_taints and plain.deployment == ""
    flagged = parser().parse_args(["--namespace", "ns"])
    assert target_for(load_config(None, {}), flagged).namespace == "ns"


def test_past_one_process_the_shards_objects_are_cleaned_too() -> None:
    data = {
        "leader": {"lease_name": "l", "service": "svc"},
        "breaker": {"configmap": "brk"},
        "tls": {"ca_configmap": ""},
    }
    one = target_for(load_config(None, data), parser().parse_args([]))
    assert (one.shard_leases, one.shard_services, one.configmaps) == ((), (), ("brk",))

    three = target_for(
        load_config(None, {**data, "shards": {"count": 3, "sizes_configmap": "sizes"}}),
        parser().parse_args([]),
    )
    assert three.lease == "l"
    assert three.shard_leases == ("l-shard-0", "l-shard-1", "l-shard-2")
    assert three.shard_services == ("svc-shard-0", "svc-shard-1", "svc-shard-2")
    assert three.configmaps == ("brk", "brk-shard-0", "brk-shard-1", "brk-shard-2", "sizes")

    no_service = {**data, "leader": {"lease_name": "l", "service": ""}, "shards": {"count": 2}}
    bare = target_for(load_config(None, no_service), parser().parse_args([]))
    assert (bare.shard_leases, bare.shard_services) == (("l-shard-0", "l-shard-1"), ())


def test_bad_configuration_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "controller.yaml"
    bad.write_text("cleanup:\n  stop_timeout_s: -1\n")
    assert cli.main(["cleanup", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuhealth-controller cleanup: ") and "stop_timeout_s" in err
