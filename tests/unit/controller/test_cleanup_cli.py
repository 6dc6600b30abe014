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


def test_bad_configuration_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "controller.yaml"
    bad.write_text("cleanup:\n  stop_timeout_s: -1\n")
    assert cli.main(["cleanup", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuhealth-controller cleanup: ") and "stop_timeout_s" in err
