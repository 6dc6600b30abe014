"""Child processes of the local control plane: start with a log file, probe, stop for sure."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import http.client
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuhealth.common.errors import GpuHealthError

LOG_TAIL_LINES = 40
"""Lines of a process log shown when it fails to start."""

Probe = Callable[[], bool]

_live: set[ManagedProcess] = set()


class LocalKubeError(GpuHealthError):
    """A local control-plane component could not be found, started or reached."""


class PortInUse(LocalKubeError):
    """A process could not bind the port it was given (someone took it after we looked)."""


@dataclass(frozen=True)
class ProbeSettings:
    """How long and how often readiness is polled."""

    timeout_s: float = 60.0
    interval_s: float = 0.1
    request_timeout_s: float = 2.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def http_probe(
    url: str,
    ca_file: Path | None = None,
    cert: tuple[Path, Path] | None = None,
    request_timeout_s: float = 2.0,
) -> Probe:
    """A probe that is true once ``url`` answers 200 (TLS verified against ``ca_file``)."""
    context: ssl.SSLContext | None = None
    if url.startswith("https://"):
        context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
        if ca_file is None:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if cert is not None:
            context.load_cert_chain(str(cert[0]), str(cert[1]))

    def probe() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=request_timeout_s, context=context) as resp:
                return bool(resp.status == 200)
        except (OSError, http.client.HTTPException):  # URLError and SSLError are OSErrors
            return False

    return probe


class ManagedProcess:
    """One binary run in its own session, logging to ``log_path``, stopped TERM-then-KILL."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, cwd: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.cwd = cwd
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> None:
        with self.log_path.open("wb") as log:
            try:
                self._proc = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self.cwd,
                    # Own session: a Ctrl-C in the terminal reaches us, and we stop the
                    # children in order, instead of the terminal killing them mid-test.
                    start_new_session=True,
                )
            except OSError as exc:
                raise LocalKubeError(f"cannot run {self.name} ({self.argv[0]}): {exc}") from exc
        _live.add(self)

    def exited(self) -> int | None:
        """The exit code if the process has ended, else None."""
        return self._proc.poll() if self._proc else None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def failure(self, what: str) -> LocalKubeError:
        tail = self.log_tail()
        kind = PortInUse if "address already in use" in tail else LocalKubeError
        return kind(f"{self.name} {what}; last lines of {self.log_path}:\n{tail}")

    def _check_alive(self) -> None:
        code = self.exited()
        if code is not None:
            raise self.failure(f"exited with code {code} before it was ready")

    def wait_ready(self, probe: Probe, settings: ProbeSettings) -> None:
        """Block until ``probe`` is true; fail fast if the process dies."""
        deadline = time.monotonic() + settings.timeout_s
        while True:
            self._check_alive()
            if probe():
                return
            if time.monotonic() > deadline:
                raise self.failure(f"not ready after {settings.timeout_s:.0f}s")
            time.sleep(settings.interval_s)

    async def wait_ready_async(self, probe: Probe, settings: ProbeSettings) -> None:
        """Like :meth:`wait_ready` without blocking the event loop."""
        deadline = time.monotonic() + settings.timeout_s
        while True:
            self._check_alive()
            if await asyncio.to_thread(probe):
                return
            if time.monotonic() > deadline:
                raise self.failure(f"not ready after {settings.timeout_s:.0f}s")
            await asyncio.sleep(settings.interval_s)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM, wait up to ``grace_s``, then SIGKILL. Safe to call twice."""
        proc = self._proc
        _live.discard(self)
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@atexit.register
def _kill_leftovers() -> None:
    """Last line of defence: nothing we started outlives the interpreter."""
    for proc in list(_live):
        proc.stop(grace_s=2.0)
