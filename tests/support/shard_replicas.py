"""Replicas past one process, each with its own shards' nodes: a real fleet, node cache
stand-in, ``ApiV1`` and ``StatusPage`` per replica, wrapped in
:class:`~gpuhealth.controller.shards.reads.MergedReads`; and in-process peers that answer a
shard from its owner's ``scope=local`` read (the HTTP path is the integration tests')."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from aiohttp import web
from aiohttp.typedefs import Middleware

from gpuhealth.controller.breaker.gate import CircuitBreaker
from gpuhealth.controller.breaker.settings import BreakerSettings
from gpuhealth.controller.fleet.cache import FleetCache
from gpuhealth.controller.fleet.model import Fleet
from gpuhealth.controller.http.api import FLEET_PATH, ApiV1, node_fragment
from gpuhealth.controller.names import Keys
from gpuhealth.controller.shards.peers import ShardAnswer
from gpuhealth.controller.shards.reads import MergedReads, Peers
from gpuhealth.controller.status_page import StatusPage
from gpuhealth.controller.status_page.page import OVERVIEW_NODES, OVERVIEW_PATH
from gpuhealth.protocol import HealthState
from gpuhealth.protocol.shards import shard_of
from tests.support.clock import FakeClock
from tests.support.fleet import connect
from tests.support.nodes import FakeNodeCache

KEYS = Keys()
TAINT = {"key": f"{KEYS.prefix}/unhealthy", "value": "xid-79", "effect": "NoSchedule"}


@dataclass
class Replica:
    """One replica: the shards it owns and the nodes of those shards."""

    owned: set[int]
    clock: FakeClock
    fleet: Fleet
    nodes: FakeNodeCache
    api: ApiV1
    page: StatusPage
    reads: MergedReads | None = None

    def own(self) -> frozenset[int]:
        return frozenset(self.owned)

    def app(self, front: Sequence[Middleware] = ()) -> web.Application:
        """Its HTTP application: the fleet and overview routes behind ``front`` (the
        authorizer) and its merged reads."""
        assert self.reads is not None
        app = web.Application(middlewares=[*front, self.reads.middleware])
        app.add_routes(self.api.routes())
        self.page.add_routes(app)
        return app


def node_names(count: int, shards: int) -> dict[int, list[str]]:
    """``count`` node names cut by ``shard_of``: shard -> its names."""
    cut: dict[int, list[str]] = {i: [] for i in range(shards)}
    for n in range(count):
        name = f"gpu-node-{n}"
        cut[shard_of(name, shards)].append(name)
    return cut


def replica(
    owned: set[int],
    names: Mapping[int, Sequence[str]],
    states: Mapping[str, HealthState] | None = None,
) -> Replica:
    """A replica owning ``owned`` with the agents of those shards' ``names`` connected (each
    in ``states``' state, else healthy; an unhealthy one tainted), every Node labelled with
    its shard."""
    clock = FakeClock()
    fleet = Fleet(clock=clock)
    nodes = FakeNodeCache()
    for shard in sorted(owned):
        for name in names[shard]:
            state = (states or {}).get(name, "healthy")
            connect(fleet, name, 2, state=state)
            taints = (TAINT,) if state == "unhealthy" else ()
            nodes.set(name, *taints, gpus=2, labels={KEYS.shard_label: str(shard)})
    breaker = CircuitBreaker(BreakerSettings(), clock=clock)
    cache = FleetCache(fleet, nodes, KEYS, node_fragment)
    api = ApiV1(
        cache=cache,
        breaker_status=breaker.status,
        reset_breaker_and_requeue=list,
        is_leader=lambda: True,
        dry_run=False,
        clock=clock,
    )
    page = StatusPage(fleet=fleet, keys=KEYS, nodes=nodes, clock=clock, fleet_cache=cache)
    return Replica(owned, clock, fleet, nodes, api, page)


@dataclass
class InProcessPeers:
    """Peers answering each shard from the replica that owns it (its ``scope=local`` read);
    a shard in ``down`` does not answer."""

    replicas: list[Replica]
    count: int
    down: set[int] = field(default_factory=set)
    asked: list[tuple[int, ...]] = field(default_factory=list)

    def owner(self, shard: int) -> Replica | None:
        return next((r for r in self.replicas if shard in r.owned), None)

    async def ask(self, shard: int, path: str, params: Sequence[tuple[str, str]]) -> ShardAnswer:
        self.asked.append((shard,))
        r = self.owner(shard)
        if r is None or shard in self.down:
            return ShardAnswer((shard,), None, "did not answer")
        assert r.reads is not None
        return ShardAnswer((shard,), await r.reads.local(path, params))

    async def ask_owners(
        self, shards: Sequence[int], path: str, params: Sequence[tuple[str, str]]
    ) -> list[ShardAnswer]:
        answers = []
        for r in self.replicas:
            mine = tuple(i for i in shards if i in r.owned)
            if not mine:
                continue
            self.asked.append(mine)
            if set(mine) & self.down:
                answers.append(ShardAnswer(mine, None, "did not answer"))
                continue
            assert r.reads is not None
            answers.append(ShardAnswer(mine, await r.reads.local(path, params)))
        return answers


def merged_reads(r: Replica, peers: Peers, *, cache_s: float = 0.0) -> MergedReads:
    return MergedReads(
        peers,
        r.own,
        shard_label=KEYS.shard_label,
        fleet_path=FLEET_PATH,
        overview_path=OVERVIEW_PATH,
        local_fleet=r.api.fleet_page,
        local_overview=r.page.overview_for,
        overview_nodes=OVERVIEW_NODES,
        clock=r.clock,
        cache_s=cache_s,
    )


def cluster(
    split: Sequence[set[int]],
    names: Mapping[int, Sequence[str]],
    states: Mapping[str, HealthState] | None = None,
    make_peers: Callable[[list[Replica]], Peers] | None = None,
) -> tuple[list[Replica], Peers]:
    """Replicas owning ``split``'s shards, each with merged reads over in-process peers."""
    replicas = [replica(owned, names, states) for owned in split]
    peers: Peers = (
        make_peers(replicas) if make_peers else InProcessPeers(replicas, count=len(names))
    )
    for r in replicas:
        r.reads = merged_reads(r, peers)
    return replicas, peers
