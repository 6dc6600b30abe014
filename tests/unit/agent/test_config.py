"""AgentConfig: YAML file plus flags (flags win), errors naming file, line and field; the CLI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth.agent.cli import build_parser, config_from_args, main
from gpuhealth.agent.config import load_config
from gpuhealth.common.errors import ConfigError

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


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "gpu-node-1")
    cfg = load_config(None)
    assert (cfg.node_name, cfg.source, cfg.listen, cfg.kmsg_path) == (
        "gpu-node-1",
        "nvml",
        "0.0.0.0:9455",
        "/dev/kmsg",
    )
    assert cfg.kmsg_enabled and cfg.controller_url is None
    assert cfg.podresources.socket == "/var/lib/kubelet/pod-resources/kubelet.sock"


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


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("listen: x:1\nhealth:\n  raise_after_samples: 2\n  clean_window_s: soon\n", ":4: "),
        ("listen: x:1\nbogus: 1\n", ":2: "),
        ("health:\n  nope: 1\n", ":2: "),
        ("source: cuda\n", ":1: "),
    ],
)
def test_errors_name_line_and_field(tmp_path: Path, text: str, expected: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"{path}{expected}" in str(info.value)


@pytest.mark.parametrize("text", ["[1, 2]\n", "a: [\n"])
def test_bad_yaml_is_a_config_error(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError, match=r"agent\.yaml"):
        load_config(_write(tmp_path, text))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.yaml"):
        load_config(str(tmp_path / "nope.yaml"))


@pytest.mark.parametrize(("flag", "enabled"), [("none", False), ("NONE", False), ("/x", True)])
def test_kmsg_none_disables(flag: str, enabled: bool) -> None:
    cfg, _ = config_from_args(["--kmsg-path", flag, "--node-name", "n"])
    assert cfg.kmsg_enabled is enabled


def test_podresources_none_disables() -> None:
    cfg, _ = config_from_args(["--podresources-socket", "none", "--node-name", "n"])
    assert cfg.podresources.enabled is False


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


_yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
_keys = st.sampled_from(
    ["listen", "source", "health", "kmsg", "podresources", "stream", "tick_interval_s", "x"]
)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(_keys, _yaml_values, max_size=4) | st.text(max_size=40))
def test_any_file_is_a_config_or_a_config_error(tmp_path_factory: Any, doc: Any) -> None:
    path = tmp_path_factory.mktemp("cfg") / "agent.yaml"
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    try:
        cfg = load_config(str(path), {"node_name": "n"})
    except ConfigError as exc:
        assert str(path) in str(exc)
    else:
        assert cfg.node_name == "n"


def test_default_port_is_not_dcgm_exporters() -> None:
    """With defaults, ``source: dcgm-exporter`` must scrape dcgm-exporter, not the agent."""
    cfg = load_config(None, {"node_name": "n", "source": "dcgm-exporter"})
    own = int(cfg.listen.rpartition(":")[2])
    scraped = int(cfg.dcgm_exporter_url.split("://", 1)[1].split("/", 1)[0].rpartition(":")[2])
    assert own != scraped
    assert scraped == 9400  # dcgm-exporter's well-known port
