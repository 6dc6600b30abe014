"""The composition root: every production part of the controller, built from its configuration
in this one place and handed to :class:`gpuhealth.controller.app.Controller`.

Read top to bottom it is the controller's wiring: the core (fleet model, node watch cache,
circuit breaker, reconciler, DRA device taints), the agents' stream (TokenReview auth feeding
the fleet), placement (the scheduler extender over the fleet), idle-allocation tracking, the
status page, metrics, the HTTP application, and the split between the work every replica does
and the work only the leader does. Writes to the API server are gated here: the reconciler,
DRA and the remediation runner (``controller/remediation/assembly.py``) run only as leader work
and honour ``dry_run``; idle tracking asks ``may_write`` (leading
and not in dry run) before each pod write. "Leading" for every write is ``leader_ready``: this
replica holds the Lease *and* its leader work has prepared (the breaker's stored state loaded,
``LeaderWork.ready``); until then the gate allows no hard write and ``/readyz`` is 503.
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from functools import partial

from aiohttp import web
from prometheus_client import CollectorRegistry

from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.common.config import parse_listen
from gpuhealth.common.logging import get_logger
from gpuhealth.common.tasks import Supervisor
from gpuhealth.controller.app import Controller, ControllerParts
from gpuhealth.controller.breaker.gate import CircuitBreaker, GateMetrics, WriteGate
from gpuhealth.controller.breaker.shard_store import ShardedBreakerStore
from gpuhealth.controller.breaker.store import BreakerStore
from gpuhealth.controller.breaker.sync import BreakerSync, BreakerSyncMetrics
from gpuhealth.controller.fleet.cache import FleetCache
from gpuhealth.controller.fleet.model import Fleet
from gpuhealth.controller.fleet.pools import NodePools
from gpuhealth.controller.heap import hold_full_collections
from gpuhealth.controller.http.access_review import SubjectAccessReviewer
from gpuhealth.controller.http.api import FLEET_PATH, ApiV1, node_fragment
from gpuhealth.controller.http.auth import HttpAuthMetrics, HttpAuthorizer
from gpuhealth.controller.http.certificates import CertificateCollector, CertificateKeeper
from gpuhealth.controller.http.limits import BodyCheck, ConnectionLimits
from gpuhealth.controller.http.routes import Probes, build_http_app
from gpuhealth.controller.idle.pod_writes import PodApi
from gpuhealth.controller.idle.tracker import IdleTracker
from gpuhealth.controller.incidents.assembly import Incidents, build_incidents
from gpuhealth.controller.incidents.domain_monitor import DomainMonitor, build_domain_monitor
from gpuhealth.controller.incidents.forwarder import HandoffForwarder, HandoffLimits
from gpuhealth.controller.incidents.handoff import HandoffMetrics, HandoffRoutes
from gpuhealth.controller.incidents.job_home import JobHome
from gpuhealth.controller.kube.client import api_client
from gpuhealth.controller.kube.informer import Informer
from gpuhealth.controller.kube.lease import LeaseClient
from gpuhealth.controller.kube.node_cache import NodeCache
from gpuhealth.controller.kube.rest import ApiClient
from gpuhealth.controller.leadership.election import LeaderElector, LeaderMetrics
from gpuhealth.controller.leadership.endpoint import LeaderEndpoint
from gpuhealth.controller.leadership.work import (
    LeaderWork,
    NamedTask,
    build_leader_endpoint,
    build_leader_work,
)
from gpuhealth.controller.loop_lag import watch_loop_lag
from gpuhealth.controller.metrics import (
    ControllerMetrics,
    GaugeCollector,
    GaugeInputs,
    WatchCollector,
)
from gpuhealth.controller.names import Keys
from gpuhealth.controller.placement import (
    ClientCertificateCheck,
    ExtenderCollector,
    ExtenderHandlers,
    ExtenderMetrics,
    PlacementIndex,
    extender_routes,
)
from gpuhealth.controller.placement.http import ShardedPlacement, scores_routes
from gpuhealth.controller.placement.peer_scores import PeerScores
from gpuhealth.controller.remediation.assembly import (
    Episodes,
    RunnerDeps,
    RunnerOptions,
    build_episodes,
    hold_for,
    remediation_task,
    replica_tasks_of,
)
from gpuhealth.controller.remediation.runner import ShardCaps
from gpuhealth.controller.settings import ControllerSettings
from gpuhealth.controller.shards.labeller import LabellerMetrics, ShardLabeller
from gpuhealth.controller.shards.leases import ShardLeases, shard_lease_name, shard_service_name
from gpuhealth.controller.shards.metrics import ShardOwnedCollector
from gpuhealth.controller.shards.owner import ShardOwner, keeps_incident, labelled_shard
from gpuhealth.controller.shards.peers import ShardPeers
from gpuhealth.controller.shards.reads import MergedReads
from gpuhealth.controller.shards.redirect import NodeShards
from gpuhealth.controller.shards.sizes import ShardSizes, SizesMetrics
from gpuhealth.controller.status_page import StatusPage
from gpuhealth.controller.status_page.page import OVERVIEW_NODES, OVERVIEW_PATH
from gpuhealth.controller.stream.agent_pods import AgentPods
from gpuhealth.controller.stream.bound_tokens import TokenFacts
from gpuhealth.controller.stream.issuer_keys import IssuerKeys
from gpuhealth.controller.stream.metrics import StreamServerCollector, StreamServerMetrics
from gpuhealth.controller.stream.server import StreamServer
from gpuhealth.controller.stream.session import IngestSink
from gpuhealth.controller.stream.token_review import TokenReviewAuthenticator
from gpuhealth.controller.taints.device_taints import DeviceTaints
from gpuhealth.controller.taints.node_api import NodeApi
from gpuhealth.controller.taints.reconciler import Reconciler

log = get_logger("compose")


def _own_pool(api: ApiClient) -> ApiClient:
    """An API client of the same server and credentials with a connection pool of its own, for
    the Lease: its renewals never wait for a connection behind a storm's TokenReviews, Node
    writes and Events (at 5,000 agents connecting at once on a loaded machine the shared pool
    let the renew deadline pass: bench ``fleet_scale``). ``api`` itself when it is no
    ApiClient (tests without an API server)."""
    if not isinstance(api, ApiClient):
        return api
    return api_client(api.configuration)


def _elector(
    cfg: ControllerSettings,
    lease_api: ApiClient,
    identity: str,
    work: Callable[[], Awaitable[None]],
    *,
    clock: Clock,
    metrics: LeaderMetrics,
) -> LeaderElector:
    """The leader elector, on the Lease's own pool (``_own_pool``)."""
    return LeaderElector(
        LeaseClient(lease_api, cfg.leader.namespace, cfg.leader.lease_name),
        cfg.leader,
        identity,
        work,
        clock=clock,
        metrics=metrics,
    )


def _leadership(
    cfg: ControllerSettings,
    api: ApiClient,
    identity: str,
    cache: NodeCache,
    *,
    clock: Clock,
    registry: CollectorRegistry,
    keys: Keys,
    work_for: Callable[..., LeaderWork],
    drop: Callable[[], Awaitable[None]],
    gone: Callable[[str], Awaitable[bool]] | None,
    shards: ShardParts | None = None,
) -> tuple[LeaderElector, LeaderWork, ShardOwner | None, list[Callable[[], Awaitable[None]]]]:
    """Who writes what: with one shard, the one Lease's leader runs ``work_for(endpoints=
    [the leader's endpoint])``; past one process the one Lease's holder is the singleton
    (:func:`singleton_work`) and each replica's :class:`ShardOwner` runs ``work_for`` for
    the shards it owns and publishes each one's endpoint (``drop``: what goes when they
    change; ``gone``: whether a Node that left was deleted). Returns the
    elector, its work, the owner (None with one shard) and what closes the Lease's pool
    (after the Lease is given up: ``Controller.stop`` runs the closers last)."""
    port = parse_listen(cfg.listen)[1]
    timeout_s = cfg.reconciler.request_timeout_s

    def endpoint(service: str | None = None) -> LeaderEndpoint | None:
        return build_leader_endpoint(
            cfg.leader, api, identity, clock, port=port, timeout_s=timeout_s, service=service
        )

    main = [e] if (e := endpoint()) is not None else []
    lease_api = _own_pool(api)
    metrics = LeaderMetrics(registry)
    closers = [lease_api.close] if lease_api is not api else []
    owner: ShardOwner | None = None
    if cfg.shards.count == 1:
        work = work_for(endpoints=main)
    else:
        work = singleton_work(main, shards.singleton_tasks() if shards else ())

        def owner_work(owned: frozenset[int]) -> LeaderWork:
            state = shards.breaker_state(owned) if shards is not None else None
            return work_for(endpoints=(), breaker_state=state)

        def shard_endpoint(shard: int) -> Callable[[], Coroutine[object, object, None]] | None:
            e = endpoint(shard_service_name(cfg.leader.service, shard))
            return e.run if e is not None else None

        owner = ShardOwner(
            _shard_leases(cfg, lease_api, identity, clock=clock, metrics=metrics),
            cache,
            label=keys.shard_label,
            work=owner_work,
            on_scope=drop,
            gone=gone,
            endpoint=shard_endpoint if cfg.leader.service else None,
            clock=clock,
            settle_s=cfg.shards.rescope_settle_s,
        )
    elector = _elector(cfg, lease_api, identity, work.run, clock=clock, metrics=metrics)
    return elector, work, owner, closers


def _scope_writes(
    owner: ShardOwner,
    serves: Callable[[str], bool],
    reconciler: Reconciler,
    dra: DeviceTaints | None,
    incidents: Incidents,
) -> None:
    """Past one process, every writer asks whether this replica owns the node right before
    it writes: the reconciler (a shard lost stops its writes before the work stops), the
    DRA rules (a node not watched here would look like one without verdicts), the
    GPUIncidents (other shards' are their owners': ``keeps_incident``); the remediation
    runner and the stream's door are scoped where they are built."""
    reconciler.owns = serves
    if dra is not None:
        dra.owns = serves
    owned = owner.leases.owned
    incidents.mirror.keep = lambda i: keeps_incident(
        i.kind, i.subjects.nodes, serves=serves, owned=owned
    )


def _shard_leases(
    cfg: ControllerSettings,
    lease_api: ApiClient,
    identity: str,
    *,
    clock: Clock,
    metrics: LeaderMetrics,
) -> ShardLeases:
    """Past one process: a Lease per shard, on the Lease's own pool."""
    return ShardLeases(
        [
            LeaseClient(lease_api, cfg.leader.namespace, shard_lease_name(cfg.leader.lease_name, i))
            for i in range(cfg.shards.count)
        ],
        cfg.leader,
        cfg.shards,
        identity,
        clock=clock,
        metrics=metrics,
    )


@dataclass
class ShardParts:
    """Past one process, what the shards add to the leader's parts: the singleton's
    labeller (None in dry run: it writes Nodes), the owners' reader of the shards' sizes,
    each owned set's breaker state (its shards' ConfigMaps)."""

    cfg: ControllerSettings
    api: ApiClient
    cache: NodeCache
    label: str
    gate: WriteGate
    labeller: ShardLabeller | None
    sizes: ShardSizes
    clock: Clock
    sync_metrics: BreakerSyncMetrics
    """One for every owned set's BreakerSync (a registry takes a family once)."""

    def singleton_tasks(self) -> list[NamedTask]:
        return [NamedTask("shard-labeller", self.labeller.run)] if self.labeller else []

    def replica_tasks(self) -> list[NamedTask]:
        return [NamedTask("shard-sizes", self.sizes.run)]

    def watches(self) -> list[Informer]:
        return [self.labeller.informer] if self.labeller else []

    def min_nodes(self, owner: ShardOwner | None) -> int:
        """This owner's part of ``breaker.min_nodes``."""
        owned = owner.leases.owned() if owner is not None else frozenset()
        return self.sizes.part(self.cfg.breaker.min_nodes, owned)

    def remediation_caps(
        self, owner: Callable[[], ShardOwner | None], episodes: Episodes
    ) -> ShardCaps:
        """The remediation loop's limits for the shards ``owner()`` owns: its part of
        ``max_concurrent``; the escalation guard over every episode."""

        def part(total: int) -> int:
            o = owner()
            return self.sizes.part(total, o.leases.owned() if o is not None else frozenset())

        return ShardCaps(part, episodes.store.episodes)

    def shard_of_node(self, node: str) -> int | None:
        """The shard a watched Node's label names."""
        view = self.cache.get(node)
        return labelled_shard(view.labels, self.label, self.cfg.shards.count) if view else None

    def breaker_state(self, owned: frozenset[int]) -> BreakerSync | None:
        """The breaker's state of the shards ``owned`` (None: the breaker is off, or nothing
        is written in dry run): loaded as the owner's work prepares."""
        if not self.cfg.breaker.enabled or self.cfg.dry_run:
            return None
        store = ShardedBreakerStore(
            self.api,
            self.cfg.leader.namespace,
            self.cfg.breaker.configmap,
            owned,
            self.shard_of_node,
            timeout_s=self.cfg.reconciler.request_timeout_s,
        )
        return BreakerSync(
            self.gate.breaker, store, self.gate, self.clock, metrics=self.sync_metrics
        )


def _shard_parts(
    cfg: ControllerSettings,
    api: ApiClient,
    cache: NodeCache,
    gate: WriteGate,
    *,
    keys: Keys,
    clock: Clock,
    registry: CollectorRegistry,
) -> ShardParts | None:
    """Past one process, the shards' parts; with one shard, None. Their metrics are
    registered either way (docs/metrics.md documents the families)."""
    labels, sizes_metrics = LabellerMetrics(registry), SizesMetrics(registry)
    if cfg.shards.count == 1:
        return None
    timeout_s = cfg.reconciler.request_timeout_s
    labeller = ShardLabeller(
        api,
        cfg.shards,
        label=keys.shard_label,
        namespace=cfg.leader.namespace,
        clique_label=cfg.domains.clique_label,
        topology_labels=cfg.domains.topology_labels,
        gpu_resource=cfg.gpu_resource,
        watch=cfg.watch,
        timeout_s=timeout_s,
        clock=clock,
        metrics=labels,
    )
    sizes = ShardSizes(
        api,
        cfg.leader.namespace,
        cfg.shards.sizes_configmap,
        cfg.shards.count,
        poll_interval_s=cfg.shards.sizes_poll_interval_s,
        timeout_s=timeout_s,
        clock=clock,
        metrics=sizes_metrics,
    )
    return ShardParts(
        cfg,
        api,
        cache,
        keys.shard_label,
        gate,
        None if cfg.dry_run else labeller,
        sizes,
        clock,
        BreakerSyncMetrics(registry),
    )


def _breaker_state(
    cfg: ControllerSettings,
    api: ApiClient,
    gate: WriteGate,
    clock: Clock,
    registry: CollectorRegistry,
) -> BreakerSync | None:
    """The circuit breaker's state kept in its ConfigMap across leaders (None: the breaker is
    off, or nothing is written in dry run)."""
    if not cfg.breaker.enabled or cfg.dry_run:
        return None
    store = BreakerStore(
        api,
        cfg.leader.namespace,
        cfg.breaker.configmap,
        timeout_s=cfg.reconciler.request_timeout_s,
    )
    return BreakerSync(gate.breaker, store, gate, clock, metrics=BreakerSyncMetrics(registry))


def _node_pools(cfg: ControllerSettings, cache: NodeCache) -> NodePools:
    """Each node's pool and the GPU nodes per pool (``fleet.pool_labels``), kept from the node
    watch: the breaker's and the remediation caps' per-pool budgets read them."""
    pools = NodePools(cfg.fleet.pool_labels)
    cache.subscribe(pools.on_node)
    return pools


def _write_gate(
    cfg: ControllerSettings,
    fleet: Fleet,
    cache: NodeCache,
    pools: NodePools,
    leading: Callable[[], bool],
    *,
    clock: Clock,
    registry: CollectorRegistry,
    min_nodes: Callable[[], int] | None = None,
) -> WriteGate:
    """The one decision point for hard writes: node taints, NoExecute, DeviceTaintRules (and
    the remediation loop's disruptive steps): only the leader, within the circuit breaker's
    budgets, the fleet's and the node's pool's."""

    def gpu_nodes() -> int:
        return max(cache.gpu_node_count(), len(fleet))

    return WriteGate(
        CircuitBreaker(cfg.breaker, clock, min_nodes=min_nodes),
        gpu_nodes=gpu_nodes,
        leading=leading,
        metrics=GateMetrics(registry),
        pool_of=pools.pool,
        pool_nodes=pools.gpu_nodes,
    )


def _scraped(
    registry: CollectorRegistry, inputs: GaugeInputs, *, watches: Sequence[Informer]
) -> GaugeCollector:
    """What a scrape computes: the gauges of the fleet, taints, breaker and leadership, and
    the watch caches' 404s after their first LIST (``WatchCollector``)."""
    registry.register(WatchCollector(watches))
    return GaugeCollector(inputs, registry)


def _stream_tasks(stream: StreamServer, agent_pods: AgentPods | None) -> list[NamedTask]:
    """What the agents' stream needs running on every replica: the agent-pod watch (when
    pods are watched), the expiry of cached token reviews (when reviews are cached) and the
    pings (when on)."""
    tasks: list[NamedTask] = []
    if agent_pods is not None:
        tasks.append(NamedTask("agent-pods", agent_pods.run))
    if (reviews := stream.verifier.review_cache) is not None:
        tasks.append(NamedTask("stream-review-expiry", reviews.run_expiry))
    if stream.settings.ws_ping_interval_s is not None:
        tasks.append(NamedTask("stream-pings", stream.run_pings))
    return tasks


def build_controller(
    cfg: ControllerSettings,
    api: ApiClient,
    *,
    clock: Clock | None = None,
    identity: str | None = None,
) -> Controller:
    """The controller for ``cfg`` around one API client; ``identity`` names this replica in the
    Lease (default: the pod name)."""
    clock = clock or SystemClock()
    keys = Keys(cfg.prefix)
    timeout_s = cfg.reconciler.request_timeout_s
    registry = CollectorRegistry(auto_describe=False)
    metrics = ControllerMetrics(registry)

    # -- core: fleet model, node watch cache, breaker, reconciler, DRA ------------------------
    fleet = Fleet(cfg.fleet, clock)
    # Nodes, with the conditions that say a managed repairer owns one (remediation's rules)
    cache = NodeCache(
        api,
        cfg.watch,
        gpu_resource=cfg.gpu_resource,
        clock=clock,
        conditions=cfg.remediation.managed_repair.watched(),
    )

    # Holds the Lease and has loaded the leader's state (the breaker's): may write. Past one
    # process: owns a shard and its work for the owned shards has prepared.
    def leader_ready() -> bool:
        return owner.ready if owner is not None else elector.is_leader and leader_work.ready

    def serves(node: str) -> bool:
        """Past one process, whether this replica owns ``node``'s shard now."""
        return owner is None or owner.serves(node)

    def may_write() -> bool:
        return leader_ready() and not cfg.dry_run

    pools = _node_pools(cfg, cache)
    gate = _write_gate(
        cfg,
        fleet,
        cache,
        pools,
        leader_ready,
        clock=clock,
        registry=registry,
        # past one process, this owner's part of breaker.min_nodes
        min_nodes=(lambda: shards.min_nodes(owner) if shards else 0)
        if cfg.shards.count > 1
        else None,
    )
    shards = _shard_parts(cfg, api, cache, gate, keys=keys, clock=clock, registry=registry)
    dra = (
        DeviceTaints(api, cfg.dra, keys, gate=gate, clock=clock, timeout_s=timeout_s)
        if cfg.dra.enabled
        else None
    )
    # -- remediation: episodes on every replica, the runner as leader work (behind the gate) -
    episodes = build_episodes(
        api, keys, cfg.watch, timeout_s=timeout_s, registry=registry, clock=clock
    )
    nodes = NodeApi(
        api,
        gpu_resource=cfg.gpu_resource,
        timeout_s=timeout_s,
        events_namespace=cfg.events_namespace,
        conditions=cfg.remediation.managed_repair.watched(),
    )
    reconciler = Reconciler(
        fleet,
        cache,
        nodes,
        settings=cfg.reconciler,
        policy=cfg.policy,
        keys=keys,
        gate=gate,
        metrics=metrics,
        dry_run=cfg.dry_run,
        clock=clock,
        devices=dra,
        hold=hold_for(episodes, cfg.remediation.managed_repair),
    )
    # -- incidents: job or GPU (the judge is the stream's sink, in front of the fleet), GPU
    # nodes nobody watches (the reconciler writes their AgentMissing condition) ---------------
    incidents, stream, agent_pods = _incidents_and_stream(
        cfg,
        api,
        fleet,
        cache,
        registry,
        clock=clock,
        episodes=episodes,
        keys=keys,
        reconciler=reconciler,
        leading=leader_ready,
        may_write=may_write,
        shard_door=(door := _shard_door(cfg, api, keys, serves, clock=clock)),
    )
    remediation = remediation_task(
        RunnerOptions(
            cfg.remediation,
            gpu_resource=cfg.gpu_resource,
            own_namespace=cfg.leader.namespace,
            events_namespace=cfg.events_namespace,
            timeout_s=timeout_s,
            dry_run=cfg.dry_run,
        ),
        api,
        episodes,
        RunnerDeps(
            fleet,
            cache,
            stream,
            gate,
            reconciler.enqueue,
            clock,
            pools,
            acknowledged=incidents.overrides.of,
            owns=serves,
            caps=shards.remediation_caps(lambda: owner, episodes) if shards else None,
        ),
        registry,
    )
    # NVLink domains: one incident, one taint, one breaker decision per shared fabric
    domain_monitor = build_domain_monitor(
        cfg.domains,
        keys,
        fleet=fleet,
        cache=cache,
        book=incidents.book,
        gate=gate,
        clock=clock,
        leading=may_write,
        reconciler=reconciler,
        registry=registry,
    )
    elector, leader_work, owner, lease_closers = _leadership(
        cfg,
        api,
        identity or cfg.leader_identity(),
        cache,
        clock=clock,
        registry=registry,
        keys=keys,
        work_for=partial(
            build_leader_work,
            cache=cache,
            reconciler=reconciler,
            breaker_state=_breaker_state(cfg, api, gate, clock, registry) if not shards else None,
            dra=dra,
            dry_run=cfg.dry_run,
            adopt_incidents=incidents.adoption.run,
            incident_mirror=NamedTask("incident-mirror", incidents.mirror.run),
            remediation=remediation,
        ),
        drop=lambda: _drop_unserved(stream, fleet, domain_monitor, serves),
        gone=door.shards.gone if door is not None else None,
        shards=shards,
    )
    if owner is not None:
        _scope_writes(owner, serves, reconciler, dra, incidents)

    fleet_cache = FleetCache(fleet, cache, keys, node_fragment, pool_labels=cfg.fleet.pool_labels)

    # -- placement: the scheduler extender over the fleet -------------------------------------
    readers = _shard_readers(cfg, api, keys, owner, clock=clock, registry=registry)
    handoff = _job_handoff(cfg, incidents, readers, door, serves, clock=clock, registry=registry)
    placement, scheduler_routes, scheduler_checks = _scheduler_extender(
        cfg, fleet, registry, shards=readers.placement if readers is not None else None
    )

    # -- idle allocations: evaluated on every replica, pod writes only by the leader ----------
    idle: IdleTracker | None = None
    if cfg.idle.enabled:
        idle = IdleTracker(
            cfg.idle,
            clock,
            writer=PodApi(api, request_timeout_s=timeout_s),
            should_act=may_write,
        )
        idle.attach(fleet)
        registry.register(idle.collector())

    # -- the status page ----------------------------------------------------------------------
    status_page = StatusPage(
        fleet=fleet,
        keys=keys,
        nodes=cache,
        breaker=gate.breaker,
        idle=idle,
        dry_run=cfg.dry_run,
        clock=clock,
        episodes=episodes.store.episodes if episodes is not None else None,
        fleet_cache=fleet_cache,
        incidents=incidents.shown,
        incident_book=incidents.book,
    )

    # -- metrics ------------------------------------------------------------------------------
    gauges = _scraped(
        registry,
        GaugeInputs(
            fleet=fleet,
            breaker=gate.breaker,
            keys=keys,
            is_leader=lambda: elector.is_leader,
            node_views=cache.views,
            dra_rules=lambda: dra.rule_count() if dra else 0,
            fleet_cache=fleet_cache,
        ),
        watches=[
            cache.informer,
            *([episodes.store.informer] if episodes is not None else []),
            incidents.store.informer,
            *([agent_pods.watch] if agent_pods is not None else []),
            *(shards.watches() if shards else []),
        ],
    )

    # -- TLS: the certificate the controller keeps itself, the CA it publishes (tls:) ------
    certificates = _certificates(cfg, api, clock)
    registry.register(CertificateCollector(certificates))

    # -- HTTP: slow-client bounds, then who may call what (TokenReview + SAR) ----------------
    http_limits, http_auth = _http_guards(
        cfg, api, registry, clock, scheduler_routes, checks=scheduler_checks
    )
    supervisor = Supervisor(clock=clock)
    http = build_http_app(
        max_body_bytes=cfg.http.max_body_bytes,
        probes=Probes(
            registry=registry,
            tasks=supervisor,
            is_leader=lambda: elector.is_leader,
            leader_ready=leader_ready,
            synced=cache.synced.is_set if owner is None else lambda: owner.synced,
            node_series=gauges.node_series,
            before_scrape=fleet_cache.refresh,
        ),
        api=(
            api_v1 := ApiV1(
                cache=fleet_cache,
                breaker_status=gate.breaker.status,
                reset_breaker_and_requeue=lambda: gate.reset(by="api"),
                is_leader=leader_ready,
                dry_run=cfg.dry_run,
                clock=clock,
                episodes=episodes.store.episodes if episodes is not None else None,
                incidents=incidents.shown,
            )
        ),
        status_page=status_page.add_routes,
        agents=stream.add_routes,
        scheduler=scheduler_routes,
        # past one process, the whole fleet's reads merged from every shard's owner
        middlewares=(
            http_limits.middleware,
            http_auth.middleware,
            *(
                [readers.merged(api_v1, status_page, keys, clock).middleware]
                if readers is not None
                else []
            ),
        ),
    )

    if handoff is not None:
        http.add_routes(handoff.routes.routes())

    # -- work every replica does (leader-only work runs inside leader election) ---------------
    replica_tasks = [
        *(
            [NamedTask("node-watch", cache.run)]
            if owner is None
            else [NamedTask("shard-leases", owner.leases.run), NamedTask("shard-owner", owner.run)]
        ),
        NamedTask("fleet-silence", fleet.run_silence_checker),
        *(shards.replica_tasks() if shards else []),
        *replica_tasks_of(episodes),
        *(NamedTask(name, run) for name, run in incidents.tasks()),
        *([NamedTask("tls-certificate", certificates.run)] if certificates is not None else []),
        *_stream_tasks(stream, agent_pods),
        *([NamedTask("idle-tracker", idle.run)] if idle is not None else []),
        *(
            [NamedTask("extender-peer-scores", readers.scores.run)]
            if readers is not None and cfg.extender.enabled
            else []
        ),
        *([NamedTask("shard-handoff", handoff.forwarder.run)] if handoff is not None else []),
    ]
    domains = incidents.attach(domain_monitor, reconciler)
    replica_tasks += [
        NamedTask("nvlink-domains", domains),
        NamedTask("leader-election", elector.run),
    ]
    replica_tasks += [
        NamedTask(
            "loop-lag",
            lambda: watch_loop_lag(clock, cfg.loop_lag_interval_s, metrics.loop_lag.observe),
        ),
        NamedTask(
            "gc-hold",
            lambda: hold_full_collections(stream.admission.storm, clock, cfg.gc_full_wait_max_s),
        ),
    ]

    closers: list[Callable[[], Awaitable[None]]] = [
        reconciler.close,
        *lease_closers,
        *([dra.close] if dra is not None else []),
        *([readers.peers.close] if readers is not None else []),
    ]
    parts = ControllerParts(
        cfg=cfg,
        clock=clock,
        keys=keys,
        fleet=fleet,
        cache=cache,
        breaker=gate.breaker,
        gate=gate,
        reconciler=reconciler,
        dra=dra,
        elector=elector,
        leader_work=leader_work,
        registry=registry,
        metrics=metrics,
        stream=stream,
        agent_pods=agent_pods,
        placement=placement,
        idle=idle,
        status_page=status_page,
        http_limits=http_limits,
        http_auth=http_auth,
        incidents=incidents,
        certificates=certificates,
        shards=owner,
    )
    return Controller(
        parts, supervisor=supervisor, replica_tasks=replica_tasks, http=http, closers=closers
    )


def _incidents_and_stream(
    cfg: ControllerSettings,
    api: ApiClient,
    fleet: Fleet,
    cache: NodeCache,
    registry: CollectorRegistry,
    *,
    clock: Clock,
    episodes: Episodes | None,
    keys: Keys,
    reconciler: Reconciler,
    leading: Callable[[], bool],
    may_write: Callable[[], bool],
    shard_door: ShardDoor | None,
) -> tuple[Incidents, StreamServer, AgentPods | None]:
    """The incidents (``controller/incidents/assembly.py``) and the agents' stream, whose
    messages reach the fleet through the incidents' judge."""
    incidents = build_incidents(
        cfg.incidents,
        api,
        fleet,
        cache,
        keys=keys,
        watch=cfg.watch,
        gang_kinds=cfg.remediation.drain.gang.kinds,
        timeout_s=cfg.reconciler.request_timeout_s,
        taint_missing=cfg.policy.taint_on_agent_missing,
        clock=clock,
        exclude_label=keys.exclude_label,
        enqueue=reconciler.enqueue,
        event=reconciler.queue_event,
        synced=cache.synced.is_set,
        leading=leading,
        may_write=may_write,
        registry=registry,
        episodes=episodes.store.episodes if episodes is not None else None,
        feed=episodes.store if episodes is not None else None,
    )
    stream, pods = _agent_stream(
        cfg,
        api,
        fleet,
        registry,
        clock,
        nodes=cache,
        episodes=episodes,
        sink=incidents.judge,
        door=shard_door,
    )
    return incidents, stream, pods


def _agent_stream(
    cfg: ControllerSettings,
    api: ApiClient,
    fleet: Fleet,
    registry: CollectorRegistry,
    clock: Clock,
    *,
    nodes: NodeCache,
    episodes: Episodes | None,
    sink: IngestSink | None = None,
    door: ShardDoor | None = None,
) -> tuple[StreamServer, AgentPods | None]:
    """The agents' stream: bound tokens verified here with the issuer's keys, TokenReview for
    the rest, and a token honoured only while its pod lives (the agent pods are watched on
    every replica: agents may reach any)."""
    timeout_s = cfg.reconciler.request_timeout_s
    metrics = StreamServerMetrics()
    registry.register(StreamServerCollector(metrics))
    pods = (
        AgentPods(
            api,
            cfg.stream.agent_namespace,
            cfg.stream.agent_service_account,
            settings=cfg.watch,
            timeout_s=timeout_s,
            clock=clock,
        )
        if cfg.stream.watch_agent_pods
        else None
    )
    keys = IssuerKeys(
        api,
        clock,
        max_age_s=cfg.stream.auth_issuer_keys_max_age_s,
        unknown_key_refetch_s=cfg.stream.auth_issuer_keys_refetch_s,
        timeout_s=timeout_s,
    )
    server = StreamServer(
        cfg.stream,
        TokenReviewAuthenticator(api, cfg.stream.audience, timeout_s=timeout_s),
        sink if sink is not None else fleet,
        clock=clock,
        metrics=metrics,
        pods=pods,
        token_facts=TokenFacts(keys, nodes.uid),
        reports=episodes.record_report if episodes is not None else None,
        waiting=fleet.agent_waiting,
        serves=door.serves if door is not None else None,
        shard_of=door.shards.shard_of if door is not None else None,
    )
    return server, pods


@dataclass(frozen=True, slots=True)
class ShardDoor:
    """Past one process, the stream's door: which nodes this replica serves, and the shard
    of one it turns away."""

    serves: Callable[[str], bool]
    shards: NodeShards


def _shard_door(
    cfg: ControllerSettings,
    api: ApiClient,
    keys: Keys,
    serves: Callable[[str], bool],
    *,
    clock: Clock,
) -> ShardDoor | None:
    if cfg.shards.count == 1:
        return None
    return ShardDoor(
        serves,
        NodeShards(
            api,
            label=keys.shard_label,
            count=cfg.shards.count,
            ttl_s=cfg.shards.lookup_ttl_s,
            max_concurrent=cfg.shards.lookup_max_concurrent,
            timeout_s=cfg.reconciler.request_timeout_s,
            clock=clock,
        ),
    )


def singleton_work(
    endpoints: Sequence[LeaderEndpoint], tasks: Sequence[NamedTask] = ()
) -> LeaderWork:
    """Past one process, what the one Lease's holder runs: the leader's own endpoint (the
    controller's Service points at it) and ``tasks`` (the shard labeller)."""

    async def prepare() -> None:
        return None

    return LeaderWork(
        prepare=prepare,
        tasks=(*(NamedTask(f"endpoint-{e.service}", e.run) for e in endpoints), *tasks),
    )


async def _drop_unserved(
    stream: StreamServer, fleet: Fleet, domains: DomainMonitor, serves: Callable[[str], bool]
) -> None:
    """This replica's shards changed: what it held of the nodes it no longer serves goes
    (their agents' streams, going away: they come back to their shard's owner; their fleet
    records; their open NVLink domains, which their owner decides)."""
    closed = await stream.close_unserved()
    forgotten = [rec.name for rec in list(fleet) if not serves(rec.name)]
    for name in forgotten:
        fleet.forget(name)
    dropped = domains.keep_only(serves)
    log.info("shard_nodes_dropped", streams=closed, fleet=len(forgotten), domains=len(dropped))


def _certificates(
    cfg: ControllerSettings, api: ApiClient, clock: Clock
) -> CertificateKeeper | None:
    """The keeper of the certificate the controller keeps itself (``tls.secret``) and of the
    CA it publishes (``tls.ca_configmap``); None when it does neither."""
    if not (cfg.tls.secret or cfg.tls.ca_configmap) or not (cfg.tls_cert_file and cfg.tls_key_file):
        return None
    return CertificateKeeper(
        cfg.tls,
        api,
        cfg.leader.namespace,
        cert_file=cfg.tls_cert_file,
        key_file=cfg.tls_key_file,
        clock=clock,
    )


def _scheduler_extender(
    cfg: ControllerSettings,
    fleet: Fleet,
    registry: CollectorRegistry,
    *,
    shards: ShardedPlacement | None = None,
) -> tuple[PlacementIndex | None, list[web.RouteDef], dict[str, BodyCheck]]:
    """The scheduler extender over the fleet (``extender:``): its index, its routes, and the
    client-certificate check of its callers made before a body is read (mutual TLS, with
    ``extender.client_ca_file``, on kube-scheduler's routes only); nothing when it is off.
    ``shards``: past one process, other shards' nodes judged from their Node's taints and
    scored from their owners' scores (``GET /scheduler/scores``, the replicas' route)."""
    if not cfg.extender.enabled:
        return None, [], {}
    placement = PlacementIndex(fleet, cfg.extender)
    metrics = ExtenderMetrics()
    handlers = ExtenderHandlers(lambda: placement.summaries, cfg.extender, metrics, shards)
    routes = extender_routes(handlers)
    registry.register(ExtenderCollector(metrics))
    checks: dict[str, BodyCheck] = {}
    if cfg.extender.client_ca_file:
        check = ClientCertificateCheck(metrics)
        checks = {route.path: check for route in routes}
    return placement, [*routes, *scores_routes(handlers)], checks


@dataclass(frozen=True, slots=True)
class ShardReaders:
    """Past one process, what reads the whole fleet through every shard's owner."""

    peers: ShardPeers
    scores: PeerScores
    placement: ShardedPlacement
    owned: Callable[[], frozenset[int]]

    def merged(
        self, api_v1: ApiV1, status_page: StatusPage, keys: Keys, clock: Clock
    ) -> MergedReads:
        """``/api/v1/overview`` and ``/api/v1/fleet`` for the whole fleet (``scope=local``:
        this replica's shards)."""
        return MergedReads(
            self.peers,
            self.owned,
            shard_label=keys.shard_label,
            fleet_path=FLEET_PATH,
            overview_path=OVERVIEW_PATH,
            local_fleet=api_v1.fleet_page,
            local_overview=status_page.overview_for,
            overview_nodes=OVERVIEW_NODES,
            clock=clock,
            cache_s=status_page.cache_s,
        )


def _shard_readers(
    cfg: ControllerSettings,
    api: ApiClient,
    keys: Keys,
    owner: ShardOwner | None,
    *,
    clock: Clock,
    registry: CollectorRegistry,
) -> ShardReaders | None:
    """Past one process: the other owners (``ShardPeers``: over TLS when this replica serves
    it, verified with ``shards.peer_ca_file`` for the leader's Service name, which every
    replica's certificate carries), the extender's view of them, and which shards this
    replica's ``/metrics`` covers (``gpuhealth_shard_owned``). None with one shard."""
    if owner is None:
        registry.register(ShardOwnedCollector(lambda: frozenset({0}), 1))
        return None
    owned = owner.leases.owned
    registry.register(ShardOwnedCollector(owned, cfg.shards.count))
    tls = None
    if cfg.tls_cert_file:
        tls = ssl.create_default_context(cafile=cfg.shards.peer_ca_file or None)
    peers = ShardPeers(
        api,
        cfg.shards,
        namespace=cfg.leader.namespace,
        service=cfg.leader.service,
        clock=clock,
        tls=tls,
        server_hostname=f"{cfg.leader.service}.{cfg.leader.namespace}.svc" if tls else None,
        api_timeout_s=cfg.leader.request_timeout_s,
    )
    scores = PeerScores(peers, owned, cfg.extender, clock=clock)
    return ShardReaders(peers, scores, ShardedPlacement(owned, keys.owns, scores), owned)


@dataclass(frozen=True, slots=True)
class JobHandoff:
    """Past one process, the job handoffs between owners: the routes that take them and the
    forwarder that sends them."""

    routes: HandoffRoutes
    forwarder: HandoffForwarder


def _job_handoff(
    cfg: ControllerSettings,
    incidents: Incidents,
    readers: ShardReaders | None,
    door: ShardDoor | None,
    serves: Callable[[str], bool],
    *,
    clock: Clock,
    registry: CollectorRegistry,
) -> JobHandoff | None:
    """Past one process, a job is decided by its home shard's owner
    (``controller/incidents/job_home.py``): the judge's scope (its jobs, its nodes), the
    forwarder of what goes to other owners, the routes taking what comes from them, and the
    job incidents this replica's mirror adopts and expires (those it decides). None with one
    shard (the metrics are registered all the same)."""
    metrics = HandoffMetrics(registry)
    if readers is None or door is None:
        return None
    judge_s = cfg.incidents.judge
    horizon_s = max(judge_s.job_window_s, judge_s.gpu_window_s)
    s = cfg.shards
    home = JobHome(s.count, readers.owned, serves)
    forwarder = HandoffForwarder(
        readers.peers,
        HandoffLimits(
            queue_max=s.handoff_queue_max,
            batch_max=s.handoff_batch_max,
            max_body_bytes=cfg.http.max_body_bytes,
            backoff_s=s.handoff_backoff_s,
            backoff_max_s=s.handoff_backoff_max_s,
            resend_s=s.handoff_resend_s,
            horizon_s=horizon_s,
        ),
        clock=clock,
        metrics=metrics,
        node_shard=door.shards.shard_of,
    )
    incidents.judge.home = home
    incidents.judge.forwarder = forwarder
    keep = incidents.mirror.keep
    incidents.mirror.keep = lambda i: home.decides(i.key) if i.kind == "job" else keep(i)
    routes = HandoffRoutes(incidents.judge, clock, metrics, horizon_s=horizon_s)
    return JobHandoff(routes, forwarder)


def _http_guards(
    cfg: ControllerSettings,
    api: ApiClient,
    registry: CollectorRegistry,
    clock: Clock,
    scheduler_routes: Sequence[web.RouteDef],
    *,
    checks: dict[str, BodyCheck],
) -> tuple[ConnectionLimits, HttpAuthorizer]:
    """The HTTP server's slow-client and body-size bounds (the extender's routes take
    ``extender.max_body_bytes``, every other one ``http.max_body_bytes``; with
    ``extender.client_ca_file`` their callers' certificates checked before the body is read)
    and its authorizer
    (operator endpoints always, read-only ones with ``http.auth.reads: authorized``), in the
    controller's namespace."""
    timeout_s = cfg.reconciler.request_timeout_s
    auth = HttpAuthorizer(
        cfg.http.auth,
        TokenReviewAuthenticator(api, cfg.http.auth.audiences, timeout_s=timeout_s),
        SubjectAccessReviewer(api, timeout_s=timeout_s),
        namespace=cfg.leader.namespace,
        clock=clock,
        metrics=HttpAuthMetrics(registry),
    )
    body_limits = {route.path: cfg.extender.max_body_bytes for route in scheduler_routes}
    limits = ConnectionLimits(
        cfg.http, registry, body_limits=body_limits, body_checks=checks, clock=clock
    )
    return limits, auth
