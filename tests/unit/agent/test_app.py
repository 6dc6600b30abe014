"""The runtime without servers: supervised tasks, /healthz, and each source's state as /metrics
reads it (its task runs, and the source itself says its last attempt worked)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gpuhealth.agent.app import AgentApp
from gpuhealth.agent.counters import Counters, Histogram
from gpuhealth.agent.observations import ObservationSink, SourceName
from gpuhealth.agent.settings import load_config
from gpuhealth.agent.sources.base import Source
from gpuhealth.agent.sources.kmsg.settings import KmsgSettings
from gpuhealth.agent.sources.kmsg.source import KmsgSource
from gpuhealth.agent.stats import SourceReading, source_task
from gpuhealth.agent.wiring import build_agent
from tests.support.clock import FakeClock
from tests.support.wait import until


class _Src:
    """A source that runs until cancelled (or fails at once) and says what it is told."""

    def __init__(self, name: SourceName, *, up: bool = False, fail: str | None = None) -> None:
        self.name: SourceName = name
        self.up = up
        self.ready = True
        self.errors = 0
        self.polls: Histogram | None = None
        self.counters = Counters()
        self._fail = fail

    async def run(self, sink: ObservationSink) -> None:
        if self._fail is not None:
            raise RuntimeError(self._fail)
        await asyncio.Event().wait()


def _app(tmp_path: Path, *sources: Source) -> AgentApp:
    overrides = {"node_name": "n", "state_dir": str(tmp_path), "podresources": {"enabled": False}}
    cfg = load_config(None, overrides)
    return build_agent(cfg, clock=FakeClock(), sources=sources, boot_id="b")


def _readings(app: AgentApp) -> dict[str, SourceReading]:
    return {r.name: r for r in app.stats.sources()}


def _start_sources(app: AgentApp) -> None:
    for src in app.sources:
        app.supervisor.start(source_task(src.name), lambda src=src: src.run(app.driver.observe))


async def test_up_needs_the_task_running_and_the_source_saying_so(tmp_path: Path) -> None:
    nvml = _Src("nvml", up=False)
    app = _app(tmp_path, nvml)
    assert not _readings(app)["nvml"].up  # not started
    _start_sources(app)
    await asyncio.sleep(0)
    try:
        assert not _readings(app)["nvml"].up  # running, but its last attempt did not work
        nvml.up = True
        assert _readings(app)["nvml"].up
    finally:
        await app.supervisor.stop()
    assert not _readings(app)["nvml"].up  # stopped


async def test_a_silent_kernel_log_is_up_while_it_is_followed(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    kmsg = KmsgSource(str(log), KmsgSettings(), FakeClock())
    app = _app(tmp_path / "state", kmsg)
    _start_sources(app)
    try:
        await until(lambda: app.source_ready("kmsg"), "the follower to attach")
        reading = _readings(app)["kmsg"]
        assert reading.up and reading.errors == 0
    finally:
        await app.supervisor.stop()
    assert not _readings(app)["kmsg"].up


async def test_source_failure_marks_it_down(tmp_path: Path) -> None:
    app = _app(tmp_path, _Src("nvml", up=True, fail="NVML_ERROR_UNKNOWN"))
    _start_sources(app)

    async def idle() -> None:
        await asyncio.Event().wait()

    app.supervisor.start("engine-tick", idle)
    try:
        await until(lambda: _readings(app)["nvml"].errors == 1, "the crash to be counted")
        nvml = _readings(app)["nvml"]
        assert not nvml.up
        assert "NVML_ERROR_UNKNOWN" in (nvml.last_error or "")
        assert set(_readings(app)) == {"nvml"}  # other tasks are not sources
    finally:
        await app.supervisor.stop()


async def test_alive_ignores_failing_sources(tmp_path: Path) -> None:
    app = _app(tmp_path)

    async def idle() -> None:
        await asyncio.Event().wait()

    async def broken() -> None:
        raise RuntimeError("nvml gone")

    assert not app.alive()
    app.supervisor.start("engine-tick", idle)
    app.supervisor.start("source-nvml", broken)
    await asyncio.sleep(0)
    assert not app.alive()  # no HTTP server yet
    app.supervisor.start("http", idle)
    await asyncio.sleep(0)
    try:
        assert app.supervisor.status()["source-nvml"]["failures"] == 1
        assert app.alive()
    finally:
        await app.supervisor.stop()
