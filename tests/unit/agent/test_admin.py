"""The operator commands without servers: GPU selection, the command's output and argument
dispatch (the clear itself: test_engine_driver.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuhealth.agent import cli
from gpuhealth.agent.admin import (
    ClearedGpu,
    ClearResponse,
    UnknownGpuError,
    select_gpus,
)
from gpuhealth.agent.admin_cli import DEFAULT_STATE_DIR, format_clear, format_status
from tests.support.agent import XID79, status, uuid

GPUS = [status(0), status(1, "unhealthy", (XID79,)), status(2)]


@pytest.mark.parametrize(
    ("selector", "want"),
    [
        ("all", [0, 1, 2]),
        ("ALL", [0, 1, 2]),
        ("1", [1]),
        (" 2 ", [2]),
        (uuid(1), [1]),
        (uuid(1).lower(), [1]),
        (uuid(2).upper(), [2]),
    ],
)
def test_select_gpus(selector: str, want: list[int]) -> None:
    assert [s.info.index for s in select_gpus(selector, GPUS)] == want


@pytest.mark.parametrize("selector", ["7", "GPU-nope", "", "  ", "-1", uuid(1)[:-1]])
def test_select_unknown_gpu(selector: str) -> None:
    with pytest.raises(UnknownGpuError) as err:
        select_gpus(selector, GPUS)
    if selector.strip():
        assert f"0={uuid(0)}" in str(err.value)  # the message lists the GPUs there are


def test_select_all_on_an_empty_node() -> None:
    assert select_gpus("all", []) == []
    with pytest.raises(UnknownGpuError, match="known: none"):
        select_gpus("0", [])


def test_format_clear() -> None:
    resp = ClearResponse(
        node="n",
        reason="",
        gpus=[
            ClearedGpu(index=0, uuid=uuid(0), previous="healthy", current="healthy", conditions=[]),
            ClearedGpu(
                index=1,
                uuid=uuid(1),
                previous="unhealthy",
                current="healthy",
                conditions=["xid-79", "ecc-dbe"],
            ),
        ],
    )
    assert format_clear(resp).splitlines() == [
        f"GPU 0 {uuid(0)}: nothing to clear (healthy)",
        f"GPU 1 {uuid(1)}: cleared xid-79, ecc-dbe (was unhealthy, now healthy)",
    ]
    assert format_clear(ClearResponse(node="n", reason="", gpus=[])) == "no GPUs on this node"


def test_format_status() -> None:
    doc = {
        "node": "n",
        "gpus": [
            {"index": 0, "uuid": "GPU-a", "state": "healthy", "conditions": []},
            {"index": 1, "uuid": "GPU-b", "state": "unhealthy", "conditions": [{"code": "xid-79"}]},
        ],
    }
    assert format_status(doc) == "node n\nGPU 0 GPU-a healthy: -\nGPU 1 GPU-b unhealthy: xid-79"


def test_help_mentions_clear(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "gpuhealth-agent clear --gpu UUID|INDEX|all" in out and "--state-dir" in out


def test_run_mode_flags_unchanged() -> None:
    """No subcommand: the agent's own flags parse as before."""
    cfg, args = cli.config_from_args(["--source", "sim", "--state-dir", "/s", "--node-name", "x"])
    assert (cfg.source, cfg.state_dir, cfg.node_name, args.print_config) == (
        "sim",
        "/s",
        "x",
        False,
    )


def test_clear_requires_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["clear"])
    assert done.value.code == 2
    assert "--gpu" in capsys.readouterr().err


def test_clear_without_socket_fails_clearly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["clear", "--gpu", "0", "--state-dir", str(tmp_path)])
    assert code == 1
    err = capsys.readouterr().err
    assert str(tmp_path / "admin.sock") in err and "missing" in err


def test_state_dir_from_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conf = tmp_path / "agent.yaml"
    conf.write_text(f"state_dir: {tmp_path / 'elsewhere'}\n")
    assert cli.main(["status", "--config", str(conf)]) == 1
    assert str(tmp_path / "elsewhere" / "admin.sock") in capsys.readouterr().err
    assert DEFAULT_STATE_DIR == "/var/lib/gpuhealth"
