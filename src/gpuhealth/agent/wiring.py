"""Builds the agent's parts from its configuration, each with exactly what it needs.

The one place that knows how the parts fit together (docs/architecture.md "Agent"):

    sources ──observe──► EngineDriver ──► HealthEngine
                              │ transitions ──► StreamClient.publish (outbox), inline
                              │ mark dirty ───► NodeSnapshotCache ◄── /metrics, /api, stream
                              └ latched ──────► LatchedStore
    PodResourcesRefresher ──allocations──► NodeSnapshotCache (+ a Snapshot on the stream)
    StreamClient ──orders──► OrderHandler ──reports──► Outbox (reset ──► EngineDriver)

Everything a node must provide (token file, CA bundle, a usable state directory) is checked
here, before any task starts: a missing file is a :class:`ConfigError`, one line on stderr.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from gpuhealth.agent import __version__
from gpuhealth.agent.admin import AdminServer, admin_socket_path, build_admin_app
from gpuhealth.agent.app import AgentApp, AgentParts, StopRequest, core_tasks_running
from gpuhealth.agent.boot import read_boot_id
from gpuhealth.agent.engine_driver import EngineDriver
from gpuhealth.agent.health import HealthEngine, xid_catalog
from gpuhealth.agent.metrics import make_registry
from gpuhealth.agent.node_snapshot import NodeSnapshotCache
from gpuhealth.agent.observations import ResetObservation, SourceName
from gpuhealth.agent.podresources.devices import DeviceDirectory
from gpuhealth.agent.podresources.refresher import NOT_READ_YET, PodResourcesRefresher
from gpuhealth.agent.remediation.command import available, run_command
from gpuhealth.agent.remediation.nvml_probe import NvmlProbe
from gpuhealth.agent.remediation.order_handler import OrderHandler, capabilities
from gpuhealth.agent.remediation.order_results import OrderJournal
from gpuhealth.agent.remediation.reboot import reboot_executor
from gpuhealth.agent.remediation.reset import GpuResetter
from gpuhealth.agent.remediation.validation_checks import Validator
from gpuhealth.agent.server import HttpServer, build_app, status_document
from gpuhealth.agent.settings import AgentSettings
from gpuhealth.agent.sources.base import Source
from gpuhealth.agent.sources.factory import build_sources
from gpuhealth.agent.sources.nvml.source import nvml_library
from gpuhealth.agent.sources.sim.nvml import SimNvml, sim_reset_command
from gpuhealth.agent.sources.sim.reboot import SimReboot, sim_boot_id
from gpuhealth.agent.sources.sim.source import SimSource
from gpuhealth.agent.state_store import LatchedStore, StateStore
from gpuhealth.agent.stats import AgentStats, source_task
from gpuhealth.agent.stream.metrics import StreamMetrics
from gpuhealth.agent.usage import UsageAccumulator, host_resolver
from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.common.errors import ConfigError, TransientError
from gpuhealth.common.logging import get_logger
from gpuhealth.common.tasks import Supervisor
from gpuhealth.protocol import Allocation, ProtocolError
from gpuhealth.protocol.remediation import ActionReport

log = get_logger("agent.wiring")

if TYPE_CHECKING:
    from gpuhealth.agent.stream.client import StreamClient
    from gpuhealth.agent.stream.outbox import Outbox


def unobservable_xids(config: AgentSettings, catalog: xid_catalog.Catalog) -> tuple[int, ...]:
    """The XIDs this configuration cannot see, warned about once: NVML's event set (and DCGM,
    which reads it) never delivers XID 79, 119 or 120; only the kernel log does."""
    if config.kmsg_enabled or config.source == "sim":
        return ()
    xids = catalog.nvml_unreported
    log.warning(
        "kernel_log_off",
        source=config.source,
        unobservable_xids=list(xids),
        detail="NVML events cannot report these XIDs (fallen off the bus, GSP timeout/error); "
        "only the kernel log does: set kmsg_path (chart: agent.kmsg)",
    )
    return xids


def build_agent(
    config: AgentSettings,
    *,
    clock: Clock | None = None,
    sources: Sequence[Source] | None = None,
    boot_id: str | None = None,
) -> AgentApp:
    """The production agent for ``config``; ``sources`` replaces the configured ones (tests)."""
    clock = clock or SystemClock()
    if boot_id is None:
        simulated = sim_boot_id(config.state_dir) if config.source == "sim" else None
        boot_id = simulated or read_boot_id()
    # One store for everything kept across a restart (docs/architecture.md "Agent state").
    # Durable commits where durability is promised: the outbox's Events and reports (with a
    # controller); the latched verdicts and positions alone never were (a power loss is a
    # new boot, whose state they do not describe).
    durable = bool(config.controller_url) and config.stream.outbox.fsync_events
    store = StateStore(config.state_dir, durable=durable, background_checkpoint=True)
    engine = HealthEngine(config.health, clock, config.rdma.rails)
    stale = config.health.stale_after_s
    state = NodeSnapshotCache(
        config.node_name, engine, clock, sample_max_age_s=stale if stale > 0 else None
    )
    usage = UsageAccumulator(host_resolver())
    stream_metrics = StreamMetrics()
    if sources is None:
        sources = build_sources(config, clock, store, boot_id=boot_id, gpus=engine.gpu_addresses)
    # The driver knows no listener: the stream client is added below.
    driver = EngineDriver(engine, state, LatchedStore(store, boot_id), usage)
    stop = StopRequest()
    reset_by: SourceName = "sim" if config.source == "sim" else "nvml"

    def reset_done(uuid: str) -> None:
        """A GPU reset ordered over the stream: its verdicts clear."""
        driver.observe(ResetObservation(source=reset_by, at=clock.now(), uuid=uuid))

    stream, outbox, orders = _build_stream(
        config,
        _StreamParts(
            state,
            usage,
            stream_metrics,
            boot_id,
            clock,
            sources,
            store,
            reset_done,
            restart=stop.stop_and_restart,
        ),
    )
    if stream is not None:
        driver.add_listener(stream.publish, stream.queue_snapshot)
    supervisor = Supervisor(clock=clock)
    stats = AgentStats(supervisor)
    stats.add_counters(engine.counters)
    stats.add_counters(driver.counters)

    for src in sources:
        stats.add_source(src, source_task(src.name))

    pods = None
    state.set_allocations_unknown(
        NOT_READ_YET
        if config.podresources.enabled
        else "PodResources is off (podresources.enabled)"
    )
    if config.podresources.enabled:

        def allocations_unknown(why: str | None) -> None:
            """The controller must not read "no pods" into allocations it cannot trust."""
            if state.set_allocations_unknown(why) and stream is not None:
                stream.queue_snapshot()

        def allocations_changed(allocations: list[Allocation]) -> None:
            """A pod that starts or stops changes what the controller must know (idle
            detection, the extender's free-GPU count): a fresh Snapshot goes out."""
            if state.set_allocations(allocations) and stream is not None:
                stream.queue_snapshot()

        def directory() -> DeviceDirectory:
            """The GPUs (index, minor) and MIG devices the engine knows now: MIG UUIDs, index
            IDs and DRA device names resolve to their GPU."""
            return DeviceDirectory.build(engine.identities(), engine.mig_devices())

        pods = PodResourcesRefresher(
            config.podresources,
            clock,
            allocations_changed,
            directory=directory,
            on_unknown=allocations_unknown,
        )
        stats.add_source(pods, "podresources")

    registry = make_registry(state.snapshot, __version__, stats, stream_metrics)
    http = HttpServer(
        build_app(state, registry, lambda: core_tasks_running(supervisor.status())),
        config.listen,
    )
    admin = AdminServer(
        build_admin_app(driver.clear, config.node_name, lambda: status_document(state.snapshot())),
        admin_socket_path(config.state_dir),
    )
    # After every start-up check (each failure is one line on stderr): the catalog now, not
    # at the first XID, and what this configuration cannot see.
    stats.unobservable_xids = unobservable_xids(config, xid_catalog.load())
    app = AgentApp(
        AgentParts(
            node=config.node_name,
            clock=clock,
            supervisor=supervisor,
            driver=driver,
            state=state,
            stats=stats,
            sources=sources,
            http=http,
            admin=admin,
            pods=pods,
            stream=stream,
            outbox=outbox,
            orders=orders,
            tick_interval_s=config.tick_interval_s,
            shutdown_timeout_s=config.shutdown_timeout_s,
            label=config.source,
            stop=stop,
            store=store,
            state_checkpoint_interval_s=config.state_checkpoint_interval_s,
        )
    )
    return app


@dataclass(frozen=True, slots=True)
class _StreamParts:
    state: NodeSnapshotCache
    usage: UsageAccumulator
    metrics: StreamMetrics
    boot_id: str
    clock: Clock
    sources: Sequence[Source]
    store: StateStore
    reset_done: Callable[[str], None]
    restart: Callable[[], None]
    """Stop the agent and start it again (a simulated reboot)."""


def _build_orders(config: AgentSettings, parts: _StreamParts, outbox: Outbox) -> OrderHandler:
    """The controller's remediation orders: GPU reset, reboot, validation (each refused unless
    ``remediation.enabled``, and on a plaintext stream unless ``allow_plaintext_orders``);
    reports go through the outbox. NVML questions run in worker threads with deadlines
    (``gpuhealth.agent.sources.nvml.source``'s library); with the simulator its GPUs answer
    them, its reset stands for the reset command and its reboot for the reboot command
    (``executor: command``; ``sources/sim/reboot.py``)."""
    rs = config.remediation
    encrypted = (config.controller_url or "").startswith("wss:")
    if rs.enabled and not encrypted and not rs.allow_plaintext_orders:
        log.warning(
            "remediation_orders_refused_on_plaintext",
            controller_url=config.controller_url,
            hint="serve the controller over TLS (wss://), or for tests set "
            "remediation.allow_plaintext_orders",
        )
    sim = next((s for s in parts.sources if isinstance(s, SimSource)), None)
    nvml = SimNvml(sim) if sim is not None else nvml_library()
    run = sim_reset_command(sim) if sim is not None else run_command
    probe = NvmlProbe(nvml, rs.validation.nvml_timeout_s, parts.clock)
    state = parts.state

    def report(make: Callable[[int], ActionReport]) -> None:
        try:
            outbox.append(make)
        except ProtocolError as exc:
            log.error("remediation_report_invalid", error=str(exc))

    return OrderHandler(
        rs,
        node=config.node_name,
        boot_id=parts.boot_id,
        resetter=GpuResetter(probe, rs.reset, on_reset=parts.reset_done, run=run),
        rebooter=SimReboot(sim, config.state_dir, parts.restart)
        if sim is not None and rs.reboot.executor == "command"
        else reboot_executor(rs.reboot),
        validator=Validator(probe, lambda: state.snapshot().statuses, rs.validation, parts.clock),
        journal=OrderJournal(parts.store, rs.journal_size),
        report=report,
        clock=parts.clock,
        encrypted=encrypted,
        refused=parts.metrics.orders_refused,
    )


def _build_stream(
    config: AgentSettings, parts: _StreamParts
) -> tuple[StreamClient | None, Outbox | None, OrderHandler | None]:
    """The stream client, its outbox and the remediation order handler, when a controller is
    configured."""
    url = config.controller_url
    if not url:
        return None, None, None
    from gpuhealth.agent.stream.agent_view import SnapshotAgentView
    from gpuhealth.agent.stream.client import StreamClient, make_ssl_context
    from gpuhealth.agent.stream.outbox import Outbox
    from gpuhealth.agent.stream.token import TokenFile

    token = TokenFile(config.token_file)
    try:
        token.get()
    except TransientError as exc:
        raise ConfigError(f"--token-file: {exc}") from exc
    ssl_context = None
    if url.startswith("wss:"):
        try:
            ssl_context = make_ssl_context(config.controller_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"--controller-ca-file {config.controller_ca_file}: {exc}") from exc
    settings = msgspec.structs.replace(config.stream, url=url)
    outbox = Outbox(parts.store, settings.outbox, metrics=parts.metrics)
    provider = SnapshotAgentView(
        parts.state,
        parts.usage,
        version=__version__,
        expected_gpus=config.nvml.expected_gpus,
        boot_id=parts.boot_id,
        capabilities=capabilities(config.remediation, available),
    )
    orders = _build_orders(config, parts, outbox)
    client = StreamClient(
        settings,
        provider,
        outbox,
        token.get,
        ssl_context=ssl_context,
        clock=parts.clock,
        orders=orders,
        shards=config.controller_shards,
    )
    return client, outbox, orders
