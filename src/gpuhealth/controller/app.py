"""The controller process: its parts, the work every replica does, the work only the leader does,
one HTTP application, start and stop.

Everything here is handed in, built once by :func:`gpuhealth.controller.compose.build_controller`
from the configuration; nothing is added after construction.

- Every replica runs the *replica tasks* under a :class:`~gpuhealth.common.tasks.Supervisor`:
  the node watch, the fleet's silence checker, idle-allocation tracking and leader election.
  Every replica serves HTTP from its own fleet model (probes, metrics, the API, the status page,
  the agents' stream, the scheduler extender).
- Only the leader runs the :class:`~gpuhealth.controller.leadership.work.LeaderWork` (the
  elector starts it when this replica wins the Lease and cancels it when it loses it):
  adopting the circuit breaker's stored state, the reconciler, the breaker sync and DRA device
  taints. Only that work writes to the API server (idle tracking asks the elector before its
  pod writes).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CollectorRegistry

from gpuhealth.common.clock import Clock
from gpuhealth.common.tasks import Supervisor
from gpuhealth.controller.breaker.gate import CircuitBreaker, WriteGate
from gpuhealth.controller.fleet.model import Fleet
from gpuhealth.controller.http.auth import HttpAuthorizer
from gpuhealth.controller.http.certificates import CertificateKeeper
from gpuhealth.controller.http.limits import ConnectionLimits
from gpuhealth.controller.idle.tracker import IdleTracker
from gpuhealth.controller.incidents.assembly import Incidents
from gpuhealth.controller.kube.node_cache import NodeCache
from gpuhealth.controller.leadership.election import LeaderElector
from gpuhealth.controller.leadership.work import LeaderWork, NamedTask
from gpuhealth.controller.metrics import ControllerMetrics
from gpuhealth.controller.names import Keys
from gpuhealth.controller.placement import PlacementIndex
from gpuhealth.controller.settings import ControllerSettings
from gpuhealth.controller.shards.owner import ShardOwner
from gpuhealth.controller.status_page import StatusPage
from gpuhealth.controller.stream.agent_pods import AgentPods
from gpuhealth.controller.stream.server import StreamServer
from gpuhealth.controller.taints.device_taints import DeviceTaints
from gpuhealth.controller.taints.reconciler import Reconciler


@dataclass(frozen=True, slots=True)
class ControllerParts:
    """The controller's parts, for the HTTP application, tests and tools to read."""

    cfg: ControllerSettings
    clock: Clock
    keys: Keys
    fleet: Fleet
    cache: NodeCache
    breaker: CircuitBreaker
    gate: WriteGate
    """The one decision point for hard writes (``gpuhealth.controller.breaker.gate``)."""
    reconciler: Reconciler
    dra: DeviceTaints | None
    elector: LeaderElector
    leader_work: LeaderWork
    """Runs inside leader election, only while this replica leads."""
    registry: CollectorRegistry
    metrics: ControllerMetrics
    stream: StreamServer
    agent_pods: AgentPods | None
    """The agent-pod watch the stream's tokens are checked against (None: switched off)."""
    placement: PlacementIndex | None
    idle: IdleTracker | None
    status_page: StatusPage
    http_limits: ConnectionLimits
    """Slow-client bounds; :class:`gpuhealth.controller.http.limits.GuardedSite` serves with
    them."""
    http_auth: HttpAuthorizer
    """Who may call which endpoint (TokenReview + SubjectAccessReview)."""
    incidents: Incidents | None = None
    """Fleet-level incidents (``gpuhealth.controller.incidents``): the book, the judge, the
    watch."""
    certificates: CertificateKeeper | None = None
    """The certificate the controller keeps itself and the CA it publishes (``tls:``);
    started before the listener (``cli.serve``)."""
    shards: ShardOwner | None = None
    """Past one process (``shards.count`` above 1): this replica's shards and its work for
    them; None with one shard (the one Lease's leader does everything)."""


class Controller:
    def __init__(
        self,
        parts: ControllerParts,
        *,
        supervisor: Supervisor,
        replica_tasks: Sequence[NamedTask],
        http: web.Application,
        closers: Sequence[Callable[[], Awaitable[None]]] = (),
    ) -> None:
        self.parts = parts
        self.supervisor = supervisor
        self._replica_tasks = tuple(replica_tasks)
        self._http = http
        self._closers = tuple(closers)

    @property
    def replica_tasks(self) -> tuple[NamedTask, ...]:
        """The tasks every replica runs (leader election among them)."""
        return self._replica_tasks

    @property
    def is_leader(self) -> bool:
        return self.parts.elector.is_leader

    def web_app(self) -> web.Application:
        return self._http

    async def start(self) -> None:
        for t in self._replica_tasks:
            self.supervisor.start(t.name, t.run)

    async def stop(self) -> None:
        """Stop every task, give the Lease up if held, cancel pending retries."""
        self.parts.elector.retire()
        await self.supervisor.stop(timeout=self.parts.cfg.shutdown_timeout_s)
        if self.parts.shards is not None:
            await self.parts.shards.leases.release()
        await self.parts.elector.release()
        for close in self._closers:
            await close()
