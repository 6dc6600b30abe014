"""The incidents' parts, built for the composition root (``controller/compose.py``): the book,
the job-or-GPU judge (the stream's sink in front of the fleet), the unwatched-node watch, the
replaced nodes (from the episodes), their metrics and their named tasks."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from gpuhealth.common.clock import Clock
from gpuhealth.controller.fleet.model import Fleet
from gpuhealth.controller.incidents.jobs import KubePodJobs
from gpuhealth.controller.incidents.judge import IncidentJudge
from gpuhealth.controller.incidents.metrics import IncidentCollector
from gpuhealth.controller.incidents.model import IncidentBook
from gpuhealth.controller.incidents.replacements import EpisodeFeed, ReplacementIncidents
from gpuhealth.controller.incidents.settings import IncidentSettings
from gpuhealth.controller.incidents.unwatched import NodeViews, UnwatchedWatch
from gpuhealth.controller.kube.rest import ApiClient
from gpuhealth.controller.remediation.model import Episode


@dataclass(frozen=True, slots=True)
class Incidents:
    book: IncidentBook
    judge: IncidentJudge
    unwatched: UnwatchedWatch

    def tasks(self) -> list[tuple[str, Callable[[], Awaitable[None]]]]:
        """(name, coroutine function) of the work every replica does."""
        return [("incident-judge", self.judge.run), ("unwatched-nodes", self.unwatched.run)]


def build_incidents(
    settings: IncidentSettings,
    api: ApiClient,
    fleet: Fleet,
    nodes: NodeViews,
    *,
    gang_kinds: Sequence[str],
    timeout_s: float,
    taint_missing: bool,
    clock: Clock,
    exclude_label: str,
    enqueue: Callable[[str], None],
    synced: Callable[[], bool],
    may_write: Callable[[], bool],
    registry: CollectorRegistry,
    episodes: Callable[[], list[Episode]] | None = None,
    feed: EpisodeFeed | None = None,
) -> Incidents:
    """``gang_kinds``: how the remediation loop's drain finds a pod's gang (a job is one);
    ``taint_missing``: ``policy.taint_on_agent_missing``; ``feed``: the episodes as they
    change (replaced nodes become incidents)."""
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
    watch = UnwatchedWatch(
        s.unwatched,
        book,
        fleet,
        nodes,
        clock=clock,
        exclude_label=exclude_label,
        enqueue=enqueue,
        synced=synced,
        taint=taint_missing,
    )
    registry.register(IncidentCollector(book, judge.stats, watch.count))
    if feed is not None:
        ReplacementIncidents(book, feed, clock.now)
    return Incidents(book, judge, watch)
