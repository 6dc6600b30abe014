"""The incidents' parts, built for the composition root (``controller/compose.py``): the book,
the job-or-GPU judge (the stream's sink in front of the fleet), the unwatched-node watch, the
overrides (taints removed by hand), the remediation capability watch, the GPUIncident
objects (the store, the mirror that keeps them in step with the book, the adoption a new
leader runs), what people see of them, their metrics and their named tasks."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from gpuhealth.common.clock import Clock
from gpuhealth.controller.fleet.model import Fleet
from gpuhealth.controller.incidents.adoption import Adoption
from gpuhealth.controller.incidents.capabilities import CapabilityWatch
from gpuhealth.controller.incidents.domain_monitor import DomainMonitor
from gpuhealth.controller.incidents.incident_store import GPUIncidentStore
from gpuhealth.controller.incidents.jobs import KubePodJobs
from gpuhealth.controller.incidents.judge import IncidentJudge
from gpuhealth.controller.incidents.metrics import IncidentCollector
from gpuhealth.controller.incidents.mirror import IncidentMirror, IncidentsShown, MirrorMetrics
from gpuhealth.controller.incidents.model import IncidentBook
from gpuhealth.controller.incidents.overrides import TaintOverrides
from gpuhealth.controller.incidents.settings import IncidentSettings
from gpuhealth.controller.incidents.unwatched import NodeViews, UnwatchedWatch
from gpuhealth.controller.kube.events import KubeEvent
from gpuhealth.controller.kube.rest import ApiClient
from gpuhealth.controller.kube.settings import WatchSettings
from gpuhealth.controller.names import Keys
from gpuhealth.controller.remediation.model import Episode
from gpuhealth.controller.taints.reconciler import Reconciler


@dataclass(frozen=True, slots=True)
class Incidents:
    book: IncidentBook
    judge: IncidentJudge
    unwatched: UnwatchedWatch
    overrides: TaintOverrides
    store: GPUIncidentStore
    mirror: IncidentMirror
    adoption: Adoption
    shown: IncidentsShown
    """What the API, the status page and the metrics read."""
    capabilities: CapabilityWatch | None = None
    """None without the remediation episodes."""

    def tasks(self) -> list[tuple[str, Callable[[], Awaitable[None]]]]:
        """(name, coroutine function) of the work every replica does."""
        tasks: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("incident-judge", self.judge.run),
            ("unwatched-nodes", self.unwatched.run),
            ("incident-objects", self.store.run),
        ]
        if self.capabilities is not None:
            tasks.append(("capability-incidents", self.capabilities.run))
        return tasks

    def attach(
        self, domains: DomainMonitor, reconciler: Reconciler
    ) -> Callable[[], Awaitable[None]]:
        """The domain monitor (built with the reconciler and the gate) adopts its domains and
        lifts a resolved domain's taint; the reconciler's acknowledgements of hand-removed
        taints are the overrides, recorded by the leader once it adopted the incidents.
        Returns the domain monitor's task (every replica's)."""
        self.adoption.adopters.append(domains.adopt)
        self.mirror.resolvers["domain"] = domains.resolve
        reconciler.acknowledgements = self.overrides
        reconciler.detects_overrides = lambda: self.mirror.active
        return domains.run


def build_incidents(
    settings: IncidentSettings,
    api: ApiClient,
    fleet: Fleet,
    nodes: NodeViews,
    *,
    keys: Keys,
    watch: WatchSettings,
    gang_kinds: Sequence[str],
    timeout_s: float,
    taint_missing: bool,
    clock: Clock,
    exclude_label: str,
    enqueue: Callable[[str], None],
    event: Callable[[str, KubeEvent], None],
    synced: Callable[[], bool],
    leading: Callable[[], bool],
    may_write: Callable[[], bool],
    registry: CollectorRegistry,
    episodes: Callable[[], list[Episode]] | None = None,
) -> Incidents:
    """``gang_kinds``: how the remediation loop's drain finds a pod's gang (a job is one);
    ``taint_missing``: ``policy.taint_on_agent_missing``; ``may_write``: leading and not in
    dry run."""
    s = settings
    book = IncidentBook(closed_keep=s.closed_keep)
    kinds = tuple(gang_kinds)
    pods = KubePodJobs(
        api,
        gang_kinds=kinds if "job" in kinds else (*kinds, "job"),
        ttl_s=s.judge.pod_lookup_ttl_s,
        timeout_s=timeout_s,
        clock=clock,
    )
    judge = IncidentJudge(
        s.judge,
        book,
        fleet,
        clock=clock,
        jobs=pods,
        events=pods,
        may_write=may_write,
        episodes=episodes,
    )
    unwatched = UnwatchedWatch(
        s.unwatched,
        book,
        fleet,
        nodes,
        clock=clock,
        exclude_label=exclude_label,
        enqueue=enqueue,
        synced=synced,
        leading=leading,
        taint=taint_missing,
    )
    overrides = TaintOverrides(book, clock=clock, enqueue=enqueue, event=event)
    store = GPUIncidentStore(api, watch, timeout_s=timeout_s, clock=clock)
    mirror = IncidentMirror(
        s, book, store, keys, clock=clock, may_write=may_write, metrics=MirrorMetrics(registry)
    )
    capabilities = (
        CapabilityWatch(book, episodes, clock=clock, interval_s=s.capability_check_s)
        if episodes is not None
        else None
    )
    mirror.resolvers.update(
        {
            "gpu": judge.resolve,
            "job": judge.resolve,
            "unwatched": unwatched.resolve,
            "override": overrides.resolve,
        }
    )
    adopters = [judge.adopt, unwatched.adopt, overrides.adopt]
    if capabilities is not None:
        mirror.resolvers["capability"] = capabilities.resolve
        adopters.append(capabilities.adopt)
    adoption = Adoption(store, book, mirror, clock=clock, adopters=adopters)
    shown = IncidentsShown(book, store, mirror)
    registry.register(
        IncidentCollector(
            book,
            judge.stats,
            unwatched.count,
            shown=shown,
            clock=clock,
            invalid=lambda: store.invalid,
        )
    )
    return Incidents(
        book, judge, unwatched, overrides, store, mirror, adoption, shown, capabilities
    )
