"""Headless Debian ``chromium`` for the status-page tests: DOM after the scripts ran, and
screenshots kept under ``artifacts/`` (gitignored) for people to look at."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from tests.integration.tooling import require

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
VIRTUAL_TIME_MS = 5000
"""Page time chromium lets pass (timers, fetches) before it dumps or shoots."""
RUN_TIMEOUT_S = 60.0


def chromium() -> str:
    return require("chromium", "chromium-browser", hint="hack/system-deps.sh installs it")


async def _run(*args: str) -> bytes:
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        proc = await asyncio.create_subprocess_exec(
            chromium(),
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-dev-shm-usage",
            f"--user-data-dir={profile}",
            f"--virtual-time-budget={VIRTUAL_TIME_MS}",
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), RUN_TIMEOUT_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    return out


async def dump_dom(url: str) -> str:
    """The DOM as serialised after the page's scripts ran."""
    return (await _run("--dump-dom", url)).decode()


async def screenshot(url: str, name: str, size: str = "1400,1000") -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    path.unlink(missing_ok=True)
    await _run(f"--screenshot={path}", f"--window-size={size}", url)
    assert path.is_file() and path.stat().st_size > 10_000, f"no screenshot at {path}"
    return path
