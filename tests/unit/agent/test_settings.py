"""AgentSettings: the YAML file with overrides on top, errors naming file, line and field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth.agent.settings import load_config
from gpuhealth.common.errors import ConfigError


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


def test_nvml_shutdown_deadline_fits_in_the_agents_stop(tmp_path: Path) -> None:
    text = "shutdown_timeout_s: 3\nnvml:\n  shutdown_deadline_s: 3\n"
    with pytest.raises(ConfigError, match=r"nvml\.shutdown_deadline_s.*shorter"):
        load_config(_write(tmp_path, text))
    load_config(_write(tmp_path, text.replace("deadline_s: 3", "deadline_s: 2.5")))


@pytest.mark.parametrize("text", ["[1, 2]\n", "a: [\n"])
def test_bad_yaml_is_a_config_error(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError, match=r"agent\.yaml"):
        load_config(_write(tmp_path, text))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.yaml"):
        load_config(str(tmp_path / "nope.yaml"))


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


SHARDED = "wss://gh-controller-shard-{shard}.ns.svc:8443/v1/stream"
PLAIN = "wss://gh-controller.ns.svc:8443/v1/stream"


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        ({}, None),  # stand-alone
        ({"controller_url": PLAIN}, None),  # today's release: one shard
        ({"controller_url": SHARDED}, None),  # one shard, {shard} is 0
        ({"controller_url": SHARDED, "controller_shards": 3}, None),
        ({"controller_url": SHARDED, "controller_shards": 64}, None),
        ({"controller_url": PLAIN, "controller_shards": 3}, r"controller_url.*\{shard\}"),
        ({"controller_url": SHARDED, "controller_shards": 0}, "controller_shards"),
        ({"controller_url": SHARDED, "controller_shards": 65}, "controller_shards"),
    ],
)
def test_controller_shards_with_the_url_that_names_them(
    overrides: dict[str, Any], error: str | None
) -> None:
    if error is None:
        cfg = load_config(None, {"node_name": "n", **overrides})
        assert cfg.controller_shards == overrides.get("controller_shards", 1)
    else:
        with pytest.raises(ConfigError, match=error):
            load_config(None, {"node_name": "n", **overrides})
