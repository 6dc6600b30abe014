"""The agent runtime: runs the parts it is given as named, supervised tasks, and stops them.

The parts are built from the configuration by :func:`gpuhealth.agent.wiring.build_agent`
(tests build them with fakes); this module only runs them. Every background piece is a named
task under one :class:`~gpuhealth.common.tasks.Supervisor`: each source, the engine tick loop,
the PodResources refresher, the HTTP server, the operator's admin socket and (with a controller)
the stream client. A source that raises is restarted with backoff and shows as down in
``gpuhealth_agent_source_up``; it never takes the agent down. SIGTERM / SIGINT stop everything
within ``shutdown_timeout_s``.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpuhealth.agent.admin import AdminServer
from gpuhealth.agent.engine_driver import EngineDriver
from gpuhealth.agent.node_snapshot import NodeSnapshot, NodeSnapshotCache
from gpuhealth.agent.podresources.refresher import PodResourcesRefresher
from gpuhealth.agent.server import HttpServer
from gpuhealth.agent.sources.base import Source
from gpuhealth.agent.state_store import StateStore
from gpuhealth.agent.stats import AgentStats, source_task
from gpuhealth.common.clock import Clock
from gpuhealth.common.errors import ConfigError
from gpuhealth.common.logging import get_logger
from gpuhealth.common.tasks import Supervisor, TaskFactory

if TYPE_CHECKING:
    from gpuhealth.agent.remediation.order_handler import OrderHandler
    from gpuhealth.agent.stream.client import StreamClient
    from gpuhealth.agent.stream.outbox import Outbox

log = get_logger("agent")

CORE_TASKS = ("engine-tick", "http")
"""Tasks whose death makes the agent not alive (``/healthz``); a failing source does not."""


def core_tasks_running(tasks: Mapping[str, Mapping[str, object]]) -> bool:
    """``/healthz``: the engine loop and the HTTP server run. A failing source is not a reason
    to restart the pod (it is restarted in place and shows in the metrics)."""
    return all(bool(tasks.get(name, {}).get("running")) for name in CORE_TASKS)


class StopRequest:
    """How the agent is asked to stop (a signal, a test), or to stop and start again (a
    simulated reboot, ``sources/sim/reboot.py``). Made before the parts that ask, so none of
    them needs the app."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.restart = False
        """The caller starts the agent again after it stopped."""

    def stop(self) -> None:
        self._event.set()

    def stop_and_restart(self) -> None:
        self.restart = True
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()


@dataclass(frozen=True, slots=True)
class AgentParts:
    """Everything the runtime runs (see :func:`gpuhealth.agent.wiring.build_agent`)."""

    node: str
    clock: Clock
    supervisor: Supervisor
    driver: EngineDriver
    state: NodeSnapshotCache
    stats: AgentStats
    sources: Sequence[Source]
    http: HttpServer
    admin: AdminServer
    pods: PodResourcesRefresher | None = None
    stream: StreamClient | None = None
    outbox: Outbox | None = None
    orders: OrderHandler | None = None
    """The controller's remediation orders (with the stream); its running orders stop first."""
    tick_interval_s: float = 1.0
    shutdown_timeout_s: float = 5.0
    label: str = ""
    """What the agent runs on (``nvml``, ``sim`` ...), for the start-up log line."""
    stop: StopRequest = field(default_factory=StopRequest)
    store: StateStore | None = None
    """The state store: checkpointed by a task of its own, closed at stop."""
    state_checkpoint_interval_s: float = 30.0


class AgentApp:
    def __init__(self, parts: AgentParts) -> None:
        self.parts = parts
        self.node = parts.node
        self.clock = parts.clock
        self.supervisor = parts.supervisor
        self.driver = parts.driver
        self.engine = parts.driver.engine
        self.state = parts.state
        self.stats = parts.stats
        self.sources = tuple(parts.sources)
        self.http = parts.http
        self.admin = parts.admin
        self.http_started = asyncio.Event()
        self.admin_started = asyncio.Event()
        self.admin_unavailable = asyncio.Event()
        """Set when the admin socket can never be served (the agent runs on without it)."""
        self._stop = parts.stop

    def snapshot(self) -> NodeSnapshot:
        """The full current state (for a subscriber that must resynchronise)."""
        return self.state.snapshot()

    def alive(self) -> bool:
        return core_tasks_running(self.supervisor.status())

    def source_ready(self, name: str) -> bool:
        """The source called ``name`` observes (e.g. the kernel-log follower has opened its
        file: lines written from now on are seen)."""
        return any(s.name == name and s.ready for s in self.sources)

    # -- tasks --------------------------------------------------------------------------

    async def _tick_loop(self) -> None:
        while True:
            await self.clock.sleep(self.parts.tick_interval_s)
            self.driver.tick()

    async def _serve_http(self) -> None:
        await self.http.start()
        self.http_started.set()
        log.info("http_listening", port=self.http.port)
        try:
            await asyncio.Event().wait()
        finally:
            await self.http.stop()

    async def _serve_admin(self) -> None:
        """A path that can never work (too long, a file in the way) is logged once and the
        agent runs on without the admin socket; a failed bind is retried by the supervisor."""
        try:
            await self.admin.start()
        except ConfigError as exc:
            log.error("admin_socket_unavailable", path=str(self.admin.path), error=str(exc))
            self.admin_unavailable.set()
            await asyncio.Event().wait()
        self.admin_started.set()
        log.info("admin_listening", path=str(self.admin.path))
        try:
            await asyncio.Event().wait()
        finally:
            await self.admin.stop()

    async def start(self) -> None:
        self.driver.restore_latched()
        for src in self.sources:
            self.supervisor.start(source_task(src.name), _runner(src, self.driver))
        self.supervisor.start("engine-tick", self._tick_loop)
        if self.parts.pods is not None:
            self.supervisor.start("podresources", self.parts.pods.run)
        self.supervisor.start("http", self._serve_http)
        self.supervisor.start("admin", self._serve_admin)
        store, every = self.parts.store, self.parts.state_checkpoint_interval_s
        if store is not None:
            self.supervisor.start(
                "state-checkpoint", lambda: store.checkpoint_loop(self.clock, every)
            )
        if self.parts.stream is not None:
            self.parts.stream.start(self.supervisor)
        log.info(
            "agent_started",
            node=self.node,
            source=self.parts.label,
            tasks=sorted(self.supervisor.status()),
        )

    @property
    def restart_requested(self) -> bool:
        """Set by a simulated reboot (``sources/sim/reboot.py``, through the parts'
        ``StopRequest``): the caller starts the agent again after it stopped."""
        return self._stop.restart

    def request_stop(self) -> None:
        self._stop.stop()

    async def stop(self) -> None:
        if self.parts.orders is not None:
            await self.parts.orders.stop()
        await self.supervisor.stop(self.parts.shutdown_timeout_s)
        if self.parts.outbox is not None:
            self.parts.outbox.close()
        if self.parts.store is not None:
            self.parts.store.close()
        log.info("agent_stopped")

    async def run(self) -> None:
        """Start, wait for SIGTERM / SIGINT (or :meth:`request_stop`), stop cleanly."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        try:
            await self.start()
            await self._stop.wait()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            await self.stop()


def _runner(src: Source, driver: EngineDriver) -> TaskFactory:
    async def run() -> None:
        await src.run(driver.observe)

    return run
