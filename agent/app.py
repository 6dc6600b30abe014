"""The agent runtime: sources -> health engine -> cached snapshot -> HTTP and stream.

Every background piece is a named task under one :class:`Supervisor`: the chosen source, the
kernel-log follower, the engine tick loop, the PodResources refresher, the HTTP server, the
operator's admin socket (:mod:`agent.admin`) and (with a controller) the stream client. A
source that raises is counted (``gpuhealth_agent_source_errors_total``), marked down
(``gpuhealth_agent_source_up``) and restarted with backoff; it never takes the agent down.
SIGTERM / SIGINT stop everything within ``shutdown_timeout_s``.

Observations are applied synchronously in the sources' sink: a kernel-log XID reaches the
engine, the snapshot and the transition listeners before the follower reads its next line.
"""

from __future__ import annotations

import asyncio
import signal
import ssl
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import msgspec

from gpuhealth.agent import __version__
from gpuhealth.agent.admin import (
    AdminServer,
    ClearedGpu,
    ClearRequest,
    ClearResponse,
    admin_socket_path,
    build_admin_app,
    select_gpus,
)
from gpuhealth.agent.config import AgentConfig
from gpuhealth.agent.health import HealthEngine
from gpuhealth.agent.hub import TransitionHub
from gpuhealth.agent.latched_store import LatchedStore
from gpuhealth.agent.metrics import make_registry
from gpuhealth.agent.model import GpuSample, Observation, Source, Transition
from gpuhealth.agent.podresources.refresher import PodResourcesRefresher
from gpuhealth.agent.server import HttpServer, build_app, status_document
from gpuhealth.agent.source_factory import build_sources, pci_lookup
from gpuhealth.agent.state import NodeSnapshot, NodeState
from gpuhealth.agent.stats import AgentStats
from gpuhealth.agent.stream.metrics import StreamMetrics
from gpuhealth.agent.stream_view import StreamView, read_boot_id
from gpuhealth.agent.usage import UsageAccumulator, host_resolver
from gpuhealth.agent.xid_catalog import classify
from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.common.errors import ConfigError, TransientError
from gpuhealth.common.logging import get_logger
from gpuhealth.common.tasks import Supervisor, TaskFactory
from gpuhealth.protocol import Allocation

if TYPE_CHECKING:
    from gpuhealth.agent.stream.client import StreamClient
    from gpuhealth.agent.stream.outbox import Outbox

log = get_logger("agent")

SOURCE_TASK_PREFIX = "source-"
CORE_TASKS = ("engine-tick", "http")


def xid_action(xid: int) -> str:
    return classify(xid).action


class AgentApp:
    def __init__(
        self,
        config: AgentConfig,
        *,
        clock: Clock | None = None,
        sources: Sequence[Source] | None = None,
        boot_id: str | None = None,
    ) -> None:
        """``sources`` replaces the ones the config names (tests)."""
        self.config = config
        self.clock = clock or SystemClock()
        self.boot_id = boot_id if boot_id is not None else read_boot_id()
        self.engine = HealthEngine(config.health, self.clock)
        self.stats = AgentStats()
        stale = config.health.stale_after_s
        self.state = NodeState(
            config.node_name,
            self.engine,
            self.clock,
            xid_action,
            self.stats,
            sample_max_age_s=stale if stale > 0 else None,
        )
        self.hub = TransitionHub()
        self.usage = UsageAccumulator(host_resolver())
        self.stream_metrics = StreamMetrics()
        self.registry = make_registry(self.state, __version__, self.stream_metrics)
        self.supervisor = Supervisor(clock=self.clock, on_failure=self._on_task_failure)
        self.http = HttpServer(build_app(self.state, self.registry, self.alive), config.listen)
        self.http_started = asyncio.Event()
        self.admin = AdminServer(
            build_admin_app(self.clear_verdicts, lambda: status_document(self.snapshot())),
            admin_socket_path(config.state_dir),
        )
        self.admin_started = asyncio.Event()
        self.latched = LatchedStore(config.state_dir, self.boot_id)
        self._sources = list(sources) if sources is not None else None
        self._stop = asyncio.Event()
        self._kmsg: Source | None = None
        self._all_sources: list[Source] = []
        self._outbox: Outbox | None = None
        self._stream: StreamClient | None = None
        self._started = False

    # -- the engine ---------------------------------------------------------------------

    def snapshot(self) -> NodeSnapshot:
        """The full current state (for a subscriber that must resynchronise)."""
        return self.state.snapshot()

    def alive(self) -> bool:
        """``/healthz``: the engine loop and the HTTP server run. A failing source is not
        a reason to restart the pod (it is restarted in place and shows in the metrics)."""
        tasks = self.supervisor.status()
        return all(bool(tasks.get(name, {}).get("running")) for name in CORE_TASKS)

    def kmsg_attached(self) -> bool:
        """The kernel-log follower has opened its file (lines written from now on are seen)."""
        ready = getattr(self._kmsg, "ready", None)
        return ready is not None and bool(ready.is_set())

    def subscribe_transitions(self, listener: Callable[[Transition], None]) -> None:
        """Call ``listener`` inline for every transition (it must not block)."""
        self.hub.add_listener(listener)

    def _apply(self, transitions: list[Transition]) -> None:
        self.state.mark_dirty()
        if transitions:
            self.hub.publish(transitions)
            self.latched.save(self.engine.latched())

    def clear_verdicts(self, request: ClearRequest, operator: str) -> ClearResponse:
        """Operator clear (``gpuhealth-agent clear``): through the engine, so the transitions
        reach the stream and the controller untaints as usual; the latched file is rewritten
        so that a restart does not bring the verdict back."""
        cleared: list[ClearedGpu] = []
        for st in select_gpus(request.gpu, self.engine.statuses()):
            transitions = self.engine.clear(st.info.uuid)
            self._apply(transitions)
            current = transitions[-1].current if transitions else st.state
            codes = [c.code for c in st.conditions]
            cleared.append(
                ClearedGpu(
                    index=st.info.index,
                    uuid=st.info.uuid,
                    previous=st.state,
                    current=current,
                    conditions=codes,
                )
            )
            if not codes:
                log.info("verdict_clear_nothing_to_clear", gpu=st.info.index, uuid=st.info.uuid)
                continue
            self.stats.verdicts_cleared_total += 1
            log.info(
                "verdict_cleared",
                gpu=st.info.index,
                uuid=st.info.uuid,
                previous=st.state,
                current=current,
                conditions=codes,
                reason=request.reason,
                operator=operator,
            )
        self.latched.save(self.engine.latched())
        return ClearResponse(node=self.config.node_name, reason=request.reason, gpus=cleared)

    def sink_for(self, source: str) -> Callable[[Observation], None]:
        def sink(obs: Observation) -> None:
            transitions = self.engine.observe(obs)
            if isinstance(obs, GpuSample):
                self.usage.record(obs)
                self.state.note_sample()
            self.stats.source_ok(source)
            self._apply(transitions)

        return sink

    async def _tick_loop(self) -> None:
        while True:
            await self.clock.sleep(self.config.tick_interval_s)
            self._apply(self.engine.tick())
            self._pull_counters()

    def _pull_counters(self) -> None:
        """Copy the sources' own state into the exported stats: up (the task runs and the
        source says its last attempt worked; the kernel-log follower, often silent, is up
        while it runs), NVML call deadlines and kernel-log line counts."""
        tasks = self.supervisor.status()
        for src in self._all_sources:
            running = bool(tasks.get(f"{SOURCE_TASK_PREFIX}{src.name}", {}).get("running"))
            health = self.stats.source(src.name)
            own = getattr(src, "up", None)
            if src.name == "kmsg" or not isinstance(own, bool):
                health.up = running and (src.name == "kmsg" or health.up)
            else:
                health.up = running and own
            timeouts = getattr(src, "call_timeouts_total", None)
            if isinstance(timeouts, dict):
                self.stats.nvml_call_timeouts = dict(timeouts)
        kmsg = self._kmsg
        if kmsg is not None:
            self.stats.kmsg_lines_total = int(getattr(kmsg, "lines_total", 0))
            self.stats.kmsg_malformed_lines_total = int(getattr(kmsg, "malformed_total", 0))

    def _on_task_failure(self, name: str, exc: BaseException) -> None:
        if name.startswith(SOURCE_TASK_PREFIX):
            self.stats.source_failed(name.removeprefix(SOURCE_TASK_PREFIX), f"{exc}")

    # -- tasks --------------------------------------------------------------------------

    async def _serve_http(self) -> None:
        await self.http.start()
        self.http_started.set()
        log.info("http_listening", listen=self.config.listen, port=self.http.port)
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
            await asyncio.Event().wait()
        self.admin_started.set()
        log.info("admin_listening", path=str(self.admin.path))
        try:
            await asyncio.Event().wait()
        finally:
            await self.admin.stop()

    async def _refresh_pods(self) -> None:
        refresher = PodResourcesRefresher(
            self.config.podresources,
            self.clock,
            self._set_allocations,
            health=self.stats.source("podresources"),
        )
        await refresher.run()

    def _set_allocations(self, allocations: list[Allocation]) -> None:
        """A pod that starts or stops changes what the controller must know (idle detection,
        the extender's free-GPU count): send a fresh Snapshot when the allocations change."""
        if self.state.set_allocations(allocations) and self._stream is not None:
            self._stream.queue_snapshot()

    def _build_stream(self) -> StreamClient | None:
        """The stream client, when a controller is configured. Everything it needs from the
        node (token, CA bundle, state dir) is checked here, before any task starts: a missing
        file is a :class:`ConfigError` (one line on stderr, exit 2), not a retry loop."""
        url = self.config.controller_url
        if not url:
            return None
        from gpuhealth.agent.stream.client import StreamClient, make_ssl_context
        from gpuhealth.agent.stream.outbox import Outbox
        from gpuhealth.agent.stream.token import TokenFile

        token = TokenFile(self.config.token_file)
        try:
            token.get()
        except TransientError as exc:
            raise ConfigError(f"--token-file: {exc}") from exc
        ssl_context = None
        if url.startswith("wss:"):
            try:
                ssl_context = make_ssl_context(self.config.controller_ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(
                    f"--controller-ca-file {self.config.controller_ca_file}: {exc}"
                ) from exc
        settings = msgspec.structs.replace(self.config.stream, url=url)
        outbox = Outbox(self.config.state_dir, settings.outbox, metrics=self.stream_metrics)
        view = StreamView(
            self.state,
            self.usage,
            version=__version__,
            expected_gpus=self.config.nvml.expected_gpus,
            boot_id=self.boot_id,
        )
        self._outbox = outbox
        return StreamClient(
            settings, view, outbox, token.get, ssl_context=ssl_context, clock=self.clock
        )

    def latched_restore(self) -> None:
        """Re-raise the XID/ECC verdicts saved before a restart on this boot."""
        restored = self.latched.load()
        if restored:
            log.info("latched_verdicts_restored", gpus=len(restored))
            self._apply(self.engine.restore_latched(restored))

    async def start(self) -> None:
        stream = self._build_stream()
        self._started = True
        self.latched_restore()
        sources = self._sources
        if sources is None:
            sources = build_sources(self.config, self.clock, pci_lookup(self.engine))
        for src in sources:
            self._all_sources.append(src)
            if src.name == "kmsg":
                self._kmsg = src
            self.stats.source(src.name)
            if hasattr(src, "poll_observer"):
                src.poll_observer = _poll_observer(self.stats, src.name)
            self.supervisor.start(f"{SOURCE_TASK_PREFIX}{src.name}", _runner(src, self))
        self.supervisor.start("engine-tick", self._tick_loop)
        if self.config.podresources.enabled:
            self.supervisor.start("podresources", self._refresh_pods)
        self.supervisor.start("http", self._serve_http)
        self.supervisor.start("admin", self._serve_admin)
        if stream is not None:
            self.hub.add_listener(stream.publish)
            stream.start(self.supervisor)
            self._stream = stream
        log.info(
            "agent_started",
            node=self.config.node_name,
            source=self.config.source,
            tasks=sorted(self.supervisor.status()),
        )

    def request_stop(self) -> None:
        self._stop.set()

    async def stop(self) -> None:
        await self.supervisor.stop(self.config.shutdown_timeout_s)
        if self._outbox is not None:
            self._outbox.close()
            self._outbox = None
        if self._started:  # a start that failed its checks is reported by the caller alone
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


def _runner(src: Source, app: AgentApp) -> TaskFactory:
    sink = app.sink_for(src.name)

    async def run() -> None:
        await src.run(sink)

    return run


def _poll_observer(stats: AgentStats, source: str) -> Callable[[float], None]:
    def observe(seconds: float) -> None:
        stats.observe_poll(source, seconds)

    return observe
