"""``gpuhealth-controller`` serves on the event loop its settings name (controller/cli.py):
uvloop by default, asyncio's own as the fallback."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import uvloop

from gpuhealth.controller import cli
from gpuhealth.controller.settings import ControllerSettings


@pytest.mark.parametrize(
    ("setting", "loop_type"),
    [(None, uvloop.Loop), ("uvloop", uvloop.Loop), ("asyncio", asyncio.BaseEventLoop)],
)
def test_the_controller_serves_on_the_configured_event_loop(
    setting: str | None,
    loop_type: type,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    served: list[tuple[object, ControllerSettings]] = []

    async def serve_then_exit(cfg: ControllerSettings) -> None:
        served.append((asyncio.get_running_loop(), cfg))

    monkeypatch.setattr(cli, "_serve_then_exit", serve_then_exit)
    config = tmp_path / "controller.yaml"
    config.write_text(f"event_loop: {setting}\n" if setting else "log_level: info\n")
    assert cli.main(["--config", str(config)]) == 0
    [(loop, cfg)] = served
    assert isinstance(loop, loop_type)
    assert (type(loop) is uvloop.Loop) == (setting != "asyncio")
    assert cfg.event_loop == (setting or "uvloop")


def test_an_unknown_event_loop_is_a_configuration_error(tmp_path: Path) -> None:
    config = tmp_path / "controller.yaml"
    config.write_text("event_loop: trio\n")
    assert cli.main(["--config", str(config)]) == 2
