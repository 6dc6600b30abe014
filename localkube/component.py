"""Shared start/stop logic for a component made of one or more child processes."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Self

from localkube.process import ManagedProcess, PortInUse, Probe, ProbeSettings

Launch = Callable[[], tuple[ManagedProcess, Probe]]
"""Starts one process and returns it with the probe that says it is ready."""

PORT_ATTEMPTS = 3
"""Starts tried with fresh ports when a port picked as free was taken in the meantime."""


class Component:
    """Starts its processes in order, waits for each, stops them in reverse, always.

    Subclasses implement :meth:`_launches`. Use ``with``/``async with``, or call
    ``start``/``astart`` and ``stop``/``astop``; a failed or interrupted start stops
    whatever was already running before the error propagates.
    """

    name = "component"

    def __init__(
        self,
        workdir: Path | None,
        probe: ProbeSettings,
        stop_grace_s: float,
        port_attempts: int = PORT_ATTEMPTS,
        parent_dir: Path | None = None,
    ) -> None:
        """``workdir`` is used as given (and kept); otherwise a fresh temporary directory,
        under ``parent_dir`` when set, is made and removed again by :meth:`stop`."""
        self._port_attempts = port_attempts
        self._own_workdir = workdir is None
        self.workdir = workdir or Path(
            tempfile.mkdtemp(prefix=f"localkube-{self.name}-", dir=parent_dir)
        )
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._probe_settings = probe
        self._stop_grace_s = stop_grace_s
        self.processes: list[ManagedProcess] = []
        """Running processes, oldest first."""
        self.launched: list[ManagedProcess] = []
        """Every process ever started here, running or not (for logs and checks)."""
        self.ready_seconds: dict[str, float] = {}
        """Seconds from start() until each process was ready, by process name."""

    def _launches(self) -> list[Launch]:
        raise NotImplementedError

    def _process(self, name: str, argv: list[str]) -> ManagedProcess:
        proc = ManagedProcess(name, argv, self.workdir / f"{name}.log", self.workdir)
        self.processes.append(proc)
        self.launched.append(proc)
        proc.start()
        return proc

    def _new_ports(self) -> None:
        """Pick fresh ports (and forget state tied to the old ones) before a retry."""

    def start(self) -> Self:
        for attempt in range(1, self._port_attempts + 1):
            try:
                return self._start_once()
            except PortInUse:
                if attempt == self._port_attempts:
                    raise
                self._new_ports()
        raise AssertionError("unreachable")

    async def astart(self) -> Self:
        for attempt in range(1, self._port_attempts + 1):
            try:
                return await self._astart_once()
            except PortInUse:
                if attempt == self._port_attempts:
                    raise
                self._new_ports()
        raise AssertionError("unreachable")

    def _start_once(self) -> Self:
        began = time.monotonic()
        try:
            for launch in self._launches():
                proc, probe = launch()
                proc.wait_ready(probe, self._probe_settings)
                self.ready_seconds[proc.name] = time.monotonic() - began
        except BaseException:
            self.stop(keep_workdir=True)
            raise
        return self

    async def _astart_once(self) -> Self:
        began = time.monotonic()
        try:
            for launch in self._launches():
                proc, probe = launch()
                await proc.wait_ready_async(probe, self._probe_settings)
                self.ready_seconds[proc.name] = time.monotonic() - began
        except BaseException:
            self.stop(keep_workdir=True)
            raise
        return self

    def stop(self, *, keep_workdir: bool = False) -> None:
        """Stop every process (newest first); remove the workdir if we created it."""
        while self.processes:
            self.processes.pop().stop(self._stop_grace_s)
        if self._own_workdir and not keep_workdir:
            with contextlib.suppress(OSError):
                shutil.rmtree(self.workdir)

    async def astop(self) -> None:
        await asyncio.to_thread(self.stop)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        return await self.astart()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Not via a thread: a cancelled stop must still finish killing the processes.
        self.stop()
