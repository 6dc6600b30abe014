"""``gpuhealth-agent``: flags over the file, help for every flag, --print-config, exit codes."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuhealth.agent.cli import build_parser, config_from_args, main

CONTRACT_FLAGS = [
    "--node-name",
    "--source",
    "--sim-scenario",
    "--kmsg-path",
    "--listen",
    "--controller-url",
    "--token-file",
    "--state-dir",
    "--config",
]


def _write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "agent.yaml"
    p.write_text(text)
    return str(p)


def test_flags_override_file(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "node_name: from-file\nsource: dcgm-exporter\nlisten: 127.0.0.1:1\n"
        "podresources:\n  refresh_interval_s: 30\n",
    )
    cfg, _ = config_from_args(
        ["--config", path, "--source", "sim", "--podresources-socket", "/tmp/k.sock"]
    )
    assert cfg.node_name == "from-file"
    assert cfg.source == "sim"
    assert cfg.listen == "127.0.0.1:1"
    # a nested flag merges into the file's section instead of replacing it
    assert cfg.podresources.socket == "/tmp/k.sock"
    assert cfg.podresources.refresh_interval_s == 30.0


@pytest.mark.parametrize(("flag", "enabled"), [("none", False), ("NONE", False), ("/x", True)])
def test_kmsg_none_disables(flag: str, enabled: bool) -> None:
    cfg, _ = config_from_args(["--kmsg-path", flag, "--node-name", "n"])
    assert cfg.kmsg_enabled is enabled


def test_podresources_none_disables() -> None:
    cfg, _ = config_from_args(["--podresources-socket", "none", "--node-name", "n"])
    assert cfg.podresources.enabled is False


def test_rdma_sysfs_root_flag(tmp_path: Path) -> None:
    """The flag moves the root and keeps the file's rdma settings; ``none`` disables."""
    f = tmp_path / "a.yaml"
    f.write_text("rdma:\n  poll_interval_s: 30\n")
    cfg, _ = config_from_args(
        ["--config", str(f), "--rdma-sysfs-root", "/host/sys", "--node-name", "n"]
    )
    assert (cfg.rdma.enabled, cfg.rdma.sysfs_root, cfg.rdma.poll_interval_s) == (
        True,
        "/host/sys",
        30.0,
    )
    cfg, _ = config_from_args(["--rdma-sysfs-root", "none", "--node-name", "n"])
    assert cfg.rdma.enabled is False


def test_help_documents_every_flag() -> None:
    text = build_parser().format_help()
    for flag in CONTRACT_FLAGS:
        assert flag in text
    for action in build_parser()._actions:
        assert action.help, f"{action.option_strings} has no help"


def test_print_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--print-config", "--node-name", "n1", "--source", "sim"]) == 0
    out = capsys.readouterr().out
    assert "node_name: n1" in out and "source: sim" in out and "raise_after_samples" in out


def test_config_error_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err


def test_expected_gpus_flag_reaches_nvml_settings() -> None:
    cfg, _ = config_from_args(["--expected-gpus", "8", "--node-name", "n"])
    assert cfg.nvml.expected_gpus == 8


def test_controller_shards_flag() -> None:
    url = "wss://c-{shard}.ns.svc:8443/v1/stream"
    cfg, _ = config_from_args(
        ["--node-name", "n", "--controller-url", url, "--controller-shards", "5"]
    )
    assert (cfg.controller_url, cfg.controller_shards) == (url, 5)
