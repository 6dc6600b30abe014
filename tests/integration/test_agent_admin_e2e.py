"""The operator clear end to end: a running agent (simulator + kernel-log file), its admin
socket in the state dir, ``gpuhealth-agent clear`` as a function and as a real process.

Real sockets and real time (short intervals); no Kubernetes needed.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import stat
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest

from gpuhealth.agent.admin import admin_socket_path
from gpuhealth.agent.admin_cli import AdminError, call, clear
from gpuhealth.agent.app import AgentApp
from gpuhealth.agent.engine_driver import VERDICTS_CLEARED
from gpuhealth.agent.health.transition import Transition
from gpuhealth.agent.settings import AgentSettings, load_config
from gpuhealth.agent.state_store import LatchedStore
from gpuhealth.agent.wiring import build_agent
from tests.support.wait import until

pytestmark = pytest.mark.integration

BOOT = "boot-admin"
SCENARIO = "name: admin\ngpus: 2\npoll_interval_s: 0.05\n"
# GPU 1 of the simulator sits at PCI 0000:29:00.0 (0x18 + 0x11 * index).
XID_LINE = (
    "[ 8123.456789] NVRM: Xid (PCI:0000:29:00): 79, pid='<unknown>', name=<unknown>, "
    "GPU has fallen off the bus.\n"
)
TIMEOUT_S = 10.0


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short path: a UNIX socket path must fit in 107 bytes; pytest's tmp_path may not."""
    d = tempfile.mkdtemp(prefix="gha-")
    try:
        yield Path(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _config(d: Path) -> AgentSettings:
    scenario = d / "scenario.yaml"
    scenario.write_text(SCENARIO)
    kmsg = d / "kmsg"
    if not kmsg.exists():
        kmsg.write_text("[    0.000000] Linux version 6.8.0 (buildd@lcy02)\n")
    return load_config(
        None,
        {
            "node_name": "gpu-node-7",
            "source": "sim",
            "sim_scenario": str(scenario),
            "kmsg_path": str(kmsg),
            "listen": "127.0.0.1:0",
            "state_dir": str(d / "state"),
            "tick_interval_s": 0.05,
            "podresources": {"enabled": False},
        },
    )


class Running:
    def __init__(self, app: AgentApp, cfg: AgentSettings, http: aiohttp.ClientSession) -> None:
        self.app = app
        self.config = cfg
        self.http = http
        self.base = f"http://127.0.0.1:{app.http.port}"
        self.sock = admin_socket_path(cfg.state_dir)

    async def status(self) -> dict[str, Any]:
        async with self.http.get(f"{self.base}/api/v1/status") as r:
            body: dict[str, Any] = await r.json()
        return body

    async def states(self) -> list[str]:
        return [g["state"] for g in (await self.status())["gpus"]]

    async def metrics(self) -> str:
        async with self.http.get(f"{self.base}/metrics") as r:
            return await r.text()


async def _start(cfg: AgentSettings, http: aiohttp.ClientSession) -> Running:
    app = build_agent(cfg, boot_id=BOOT)
    await app.start()
    await asyncio.wait_for(app.http_started.wait(), TIMEOUT_S)
    await asyncio.wait_for(app.admin_started.wait(), TIMEOUT_S)
    run = Running(app, cfg, http)

    async def ready() -> bool:
        return app.state.ready and app.source_ready("kmsg") and len(await run.states()) == 2

    await until(ready)
    return run


async def _with_xid79(run: Running) -> str:
    """Write the XID line, wait for GPU 1 to turn unhealthy; its UUID."""
    with open(run.config.kmsg_path, "a") as f:
        f.write(XID_LINE)

    async def unhealthy() -> str | None:
        gpu = (await run.status())["gpus"][1]
        return str(gpu["uuid"]) if gpu["state"] == "unhealthy" else None

    uuid: str = await until(unhealthy)
    return uuid


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def test_clear_xid79_end_to_end(
    short_dir: Path, http: aiohttp.ClientSession, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _config(short_dir)
    run = await _start(cfg, http)
    try:
        assert stat.S_IMODE(run.sock.stat().st_mode) == 0o600
        assert stat.S_ISSOCK(run.sock.stat().st_mode)
        uuid = await _with_xid79(run)
        assert list(LatchedStore(cfg.state_dir, BOOT).load()) == [uuid]
        seen: list[Transition] = []
        run.app.parts.driver.add_listener(seen.append)

        resp = await clear(run.sock, uuid.lower(), "reseated by dc-ops", timeout_s=TIMEOUT_S)

        assert resp.node == "gpu-node-7" and resp.reason == "reseated by dc-ops"
        [gpu] = resp.gpus
        assert (gpu.index, gpu.uuid, gpu.previous, gpu.current) == (1, uuid, "unhealthy", "healthy")
        assert gpu.conditions == ["xid-79"]
        assert await run.states() == ["healthy", "healthy"]
        assert [(t.uuid, t.previous, t.current) for t in seen] == [(uuid, "unhealthy", "healthy")]
        assert LatchedStore(cfg.state_dir, BOOT).load() == {}
        assert "gpuhealth_agent_verdicts_cleared_total 1.0" in await run.metrics()
        logged = [ln for ln in capsys.readouterr().out.splitlines() if "verdict_cleared" in ln]
        assert len(logged) == 1
        assert "reseated by dc-ops" in logged[0] and f"uid={os.getuid()}" in logged[0]

        # the admin socket also serves the status document
        doc = await call(run.sock, "GET", "/v1/status", timeout_s=TIMEOUT_S)
        assert b'"state":"unhealthy"' not in doc and uuid.encode() in doc
    finally:
        await run.app.stop()
    assert not run.sock.exists()  # removed at shutdown

    # a restart on the same boot does not bring the verdict back
    again = await _start(cfg, http)
    try:
        # the latched verdicts are restored before the first poll; let a few polls and ticks
        # pass (counted, not slept) before checking that none came back
        sim = next(s for s in again.app.sources if s.name == "sim")
        assert sim.polls is not None
        polls = sim.polls.count
        await until(lambda: sim.polls is not None and sim.polls.count >= polls + 3, "3 polls")
        assert await again.states() == ["healthy", "healthy"]
    finally:
        await again.app.stop()


async def test_real_cli_process(short_dir: Path, http: aiohttp.ClientSession) -> None:
    cfg = _config(short_dir)
    run = await _start(cfg, http)
    exe = shutil.which("gpuhealth-agent", path=str(Path(sys.executable).parent))
    argv = [exe] if exe else [sys.executable, "-m", "gpuhealth.agent.cli"]

    async def cli_run(*args: str) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            *args,
            "--state-dir",
            cfg.state_dir,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        )
        out, err = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()

    try:
        uuid = await _with_xid79(run)
        code, out, err = await cli_run("status")
        assert code == 0, err
        assert f"GPU 1 {uuid} unhealthy: xid-79" in out

        code, out, err = await cli_run("clear", "--gpu", "GPU-does-not-exist", "--reason", "x")
        assert code == 1 and out == ""
        assert "no GPU 'GPU-does-not-exist'" in err and uuid in err
        assert await run.states() == ["healthy", "unhealthy"]

        code, out, err = await cli_run("clear", "--gpu", "all", "--reason", "RMA returned")
        assert code == 0, err
        assert f"GPU 1 {uuid}: cleared xid-79 (was unhealthy, now healthy)" in out
        assert "GPU 0 " in out and "nothing to clear (healthy)" in out
        assert await run.states() == ["healthy", "healthy"]
    finally:
        await run.app.stop()
    code, out, err = await cli_run("clear", "--gpu", "0")
    assert code == 1 and "admin socket is missing" in err


async def test_unknown_gpu_by_index(short_dir: Path, http: aiohttp.ClientSession) -> None:
    run = await _start(_config(short_dir), http)
    try:
        with pytest.raises(AdminError, match=r"no GPU '5' on this node \(known: 0=GPU-"):
            await clear(run.sock, "5", "", timeout_s=TIMEOUT_S)
        with pytest.raises(AdminError, match="bad request"):
            await call(run.sock, "POST", "/v1/clear", {"gpu": "0", "x": 1}, timeout_s=TIMEOUT_S)
        assert run.app.driver.counters.value(VERDICTS_CLEARED) == 0
    finally:
        await run.app.stop()


async def test_stale_socket_is_replaced_and_a_dead_one_reported(
    short_dir: Path, http: aiohttp.ClientSession
) -> None:
    cfg = _config(short_dir)
    path = admin_socket_path(cfg.state_dir)
    path.parent.mkdir(parents=True)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))  # left behind by a killed agent: bound, nobody listening
    stale.close()

    with pytest.raises(AdminError, match="not running"):
        await clear(path, "0", "", timeout_s=TIMEOUT_S)

    run = await _start(cfg, http)
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        resp = await clear(path, "0", "", timeout_s=TIMEOUT_S)
        assert [g.conditions for g in resp.gpus] == [[]]
    finally:
        await run.app.stop()
    assert not path.exists()


@pytest.mark.parametrize("case", ["too-long", "file-in-the-way"])
async def test_unusable_socket_path_leaves_the_agent_running(short_dir: Path, case: str) -> None:
    state = short_dir / ("s" * 120 if case == "too-long" else "state")
    state.mkdir()
    in_the_way = state / "admin.sock"
    if case == "file-in-the-way":
        in_the_way.write_text("not a socket")
    cfg = msgspec.structs.replace(_config(short_dir), state_dir=str(state), kmsg_path="none")
    app = build_agent(cfg, sources=[], boot_id=BOOT)
    await app.start()
    try:
        await asyncio.wait_for(app.http_started.wait(), TIMEOUT_S)
        await asyncio.wait_for(app.admin_unavailable.wait(), TIMEOUT_S)
        admin = app.supervisor.status()["admin"]
        assert admin["running"] and admin["failures"] == 0  # logged once, no crash loop
        assert not app.admin_started.is_set()
        if case == "file-in-the-way":
            assert in_the_way.read_text() == "not a socket"
    finally:
        await app.stop()
