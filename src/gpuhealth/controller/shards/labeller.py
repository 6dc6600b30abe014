"""The singleton's work past one process: every Node labelled with its shard, and the shards'
sizes kept in a ConfigMap.

While this replica holds the one Lease (``leader.lease_name``) and ``shards.count`` is above 1,
:class:`ShardLabeller` (:meth:`~ShardLabeller.run`, the named task ``shard-labeller``):

- watches every Node (its own :class:`~gpuhealth.controller.kube.informer.Informer`, no
  selector: the owners' caches are cut by the label this writes) and keeps, per Node, only its
  resourceVersion, its shard label's value, the shard it must be in
  (:func:`~gpuhealth.controller.shards.assignment.desired_shard`, from its clique and topology
  labels, so a domain is never split) and whether it is a GPU node;
- writes the shard label (``Keys.shard_label`` = the shard as a decimal string) on every Node
  whose label is missing or says another shard, non-GPU nodes too: a JSON merge patch of
  ``metadata.labels`` alone (idempotent: no resourceVersion guard), at most
  ``shards.label_concurrency`` at once, a failure retried per Node with the work queue's backoff
  (``shards.label_backoff_s`` doubling up to ``shards.label_backoff_max_s``), a 404 taken as the
  Node gone, each counted in ``gpuhealth_shard_relabels_total{result}``. A Node is written only
  when what is known of it says its label is wrong: the answer to a write is kept as the Node's
  state (it is at least as new as the watch), and an event older than what is kept is ignored,
  so a Node just written is not written again until the watch shows it changed — a hand edit
  is put back, a quiet fleet costs no write at all;
- keeps the shards' sizes (GPU nodes per shard, by the shard each must be in) in the ConfigMap
  ``shards.sizes_configmap`` (:mod:`gpuhealth.controller.shards.sizes`): once the first LIST
  is in, and then every ``shards.sizes_interval_s``, it reads the ConfigMap and writes it only
  when it does not say the current sizes (created when missing, put back when edited).

Each leadership term starts from a fresh LIST; what was kept is dropped when it ends.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote

from prometheus_client import CollectorRegistry, Counter

from gpuhealth.common.backoff import Rand
from gpuhealth.common.clock import Clock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.kube.configmap import read_data, write_data
from gpuhealth.controller.kube.informer import EventType, Informer, newer
from gpuhealth.controller.kube.node_view import gpu_quantity
from gpuhealth.controller.kube.rest import (
    MERGE_PATCH,
    ApiClient,
    KubeError,
    NotFoundError,
    request,
)
from gpuhealth.controller.kube.settings import WatchSettings
from gpuhealth.controller.shards.assignment import desired_shard, shard_sizes
from gpuhealth.controller.shards.settings import ShardSettings
from gpuhealth.controller.shards.sizes import sizes_data
from gpuhealth.controller.workqueue import WorkQueue, run_worker

log = get_logger("shards")

Result = Literal["written", "gone", "failed"]


class LabellerMetrics:
    """``gpuhealth_shard_relabels_total{result}``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.relabels = Counter(
            "gpuhealth_shard_relabels",
            "Shard label writes on Nodes by the singleton, by result: written, gone (the Node "
            "was deleted), failed (retried with backoff)",
            ["result"],
            registry=registry,
        )


@dataclass(frozen=True, slots=True)
class _Node:
    """What the labeller keeps of one Node."""

    resource_version: str
    label: str | None
    """Its shard label's value; None without one."""
    shard: int
    """The shard it must be in."""
    gpu: bool

    @property
    def stale(self) -> bool:
        return self.label != str(self.shard)


class _Nodes:
    """The informer's sink: every Node as :class:`_Node`, newest resourceVersion kept; each
    Node whose label is wrong handed to ``stale``."""

    def __init__(
        self,
        parse: Callable[[dict[str, Any]], tuple[str, _Node]],
        stale: Callable[[str], None],
    ) -> None:
        self._parse = parse
        self._stale = stale
        self.nodes: dict[str, _Node] = {}
        self.listed_once = asyncio.Event()
        """The first LIST of this term is in: the sizes are the whole fleet's."""

    def restart(self, stale: Callable[[str], None]) -> None:
        """A new term: nothing kept, stale Nodes handed to ``stale``."""
        self.nodes.clear()
        self.listed_once.clear()
        self._stale = stale

    def listed(self, items: list[dict[str, Any]], seen: set[str]) -> None:
        for obj in items:
            name, node = self._parse(obj)
            seen.add(name)
            self.put(name, node)

    def list_complete(self, seen: set[str]) -> None:
        for name in [n for n in self.nodes if n not in seen]:
            del self.nodes[name]
        self.listed_once.set()

    def apply(self, event: EventType, obj: dict[str, Any]) -> None:
        name, node = self._parse(obj)
        if event == "DELETED":
            self.nodes.pop(name, None)
        else:
            self.put(name, node)

    def put(self, name: str, node: _Node) -> None:
        """Keep ``node`` unless what is kept is newer (a write's answer outruns the watch)."""
        old = self.nodes.get(name)
        if old is not None and not newer(node.resource_version, old.resource_version):
            return
        self.nodes[name] = node
        if node.stale:
            self._stale(name)


class ShardLabeller:
    def __init__(
        self,
        api: ApiClient,
        settings: ShardSettings,
        *,
        label: str,
        namespace: str,
        clique_label: str,
        topology_labels: Sequence[str],
        gpu_resource: str,
        watch: WatchSettings,
        timeout_s: float,
        clock: Clock,
        metrics: LabellerMetrics | None = None,
        rand: Rand = random.random,
    ) -> None:
        """``label``: ``Keys.shard_label``; ``namespace``: the controller's, where the sizes
        ConfigMap lives; ``clique_label`` and ``topology_labels``: the ``domains:`` section's;
        ``timeout_s``: the deadline of one write."""
        self._api = api
        self.settings = settings
        self.label = label
        self._namespace = namespace
        self._clique_label = clique_label
        self._topology_labels = tuple(topology_labels)
        self._gpu_resource = gpu_resource
        self._timeout_s = timeout_s
        self._clock = clock
        self.metrics = metrics or LabellerMetrics(None)
        self._queue = self._new_queue()
        self._nodes = _Nodes(self._parse, self._queue.add)
        self.informer = Informer(
            api,
            "/api/v1/nodes",
            self._nodes,
            settings=watch,
            clock=clock,
            what="nodes for shard labels",
            rand=rand,
        )

    def _new_queue(self) -> WorkQueue:
        return WorkQueue(
            self._clock,
            backoff_base_s=self.settings.label_backoff_s,
            backoff_max_s=self.settings.label_backoff_max_s,
            name="shard-labels",
        )

    def _parse(self, obj: dict[str, Any]) -> tuple[str, _Node]:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        labels = meta.get("labels") or {}
        status = obj.get("status") or {}
        gpus = max(
            gpu_quantity(status.get("capacity"), self._gpu_resource),
            gpu_quantity(status.get("allocatable"), self._gpu_resource),
        )
        shard = desired_shard(
            name,
            labels,
            self.settings.count,
            clique_label=self._clique_label,
            topology_labels=self._topology_labels,
        )
        rv = str(meta.get("resourceVersion", ""))
        return name, _Node(rv, labels.get(self.label), shard, gpus > 0)

    # -- reads (tests, the lead's status) ----------------------------------------------------

    def sizes(self) -> list[int]:
        """The GPU nodes of each shard, as the watch shows them now."""
        return shard_sizes(
            (n.shard for n in self._nodes.nodes.values() if n.gpu), self.settings.count
        )

    def queued(self) -> int:
        """Nodes waiting for a write."""
        return len(self._queue)

    def stale(self) -> list[str]:
        """The Nodes whose label is missing or wrong, as the watch shows them now."""
        return sorted(name for name, n in self._nodes.nodes.items() if n.stale)

    # -- the work --------------------------------------------------------------------------

    async def run(self) -> None:
        """The named task ``shard-labeller``: watch, label, keep the sizes, until cancelled
        (the lead lost). Every term lists afresh."""
        self._queue = self._new_queue()
        self._nodes.restart(self._queue.add)
        self.informer.resume_from("")  # a fresh LIST: nothing is known of the last term
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self.informer.run(), name="shard-labeller-watch")
                tg.create_task(self._keep_sizes(), name="shard-sizes-publish")
                for i in range(self.settings.label_concurrency):
                    tg.create_task(
                        run_worker(self._queue, self._write, failure_event="shard_label_failed"),
                        name=f"shard-labeller-{i}",
                    )
        finally:
            await self._queue.close()
            self._nodes.nodes.clear()

    async def _write(self, name: str) -> bool:
        """One Node's label put right (the queue's handler)."""
        node = self._nodes.nodes.get(name)
        if node is None or not node.stale:
            return True
        value = str(node.shard)
        try:
            obj = await request(
                self._api,
                "PATCH",
                f"/api/v1/nodes/{quote(name)}",
                body={"metadata": {"labels": {self.label: value}}},
                content_type=MERGE_PATCH,
                timeout_s=self._timeout_s,
            )
        except NotFoundError:
            self._count("gone")
            return True
        except KubeError:
            self._count("failed")
            raise  # logged and retried after this Node's backoff by the worker
        self._count("written")
        if node.label is None:  # a new Node (a whole fleet on a release's first start)
            log.debug("shard_labelled", node=name, shard=value)
        else:  # a Node moved: a hand edit put back, a domain label changed
            log.info("shard_relabelled", node=name, shard=value, was=node.label)
        self.observe(obj)
        return True

    def observe(self, obj: dict[str, Any]) -> None:
        """A Node as a write's answer shows it: kept unless the watch showed a newer version."""
        self._nodes.put(*self._parse(obj))

    def _count(self, result: Result) -> None:
        self.metrics.relabels.labels(result).inc()

    async def _keep_sizes(self) -> None:
        await self._nodes.listed_once.wait()
        while True:
            try:
                await self.publish_sizes()
            except KubeError as exc:
                log.warning("shard_sizes_not_written", error=str(exc), status=exc.status)
            await self._clock.sleep(self.settings.sizes_interval_s)

    async def publish_sizes(self) -> bool:
        """Write the sizes ConfigMap when it does not say the current sizes; True when it
        was written."""
        data = sizes_data(self.settings.count, self.sizes())
        name = self.settings.sizes_configmap
        stored = await read_data(self._api, self._namespace, name, timeout_s=self._timeout_s)
        if stored is not None and all(stored.get(k) == v for k, v in data.items()):
            return False
        await write_data(self._api, self._namespace, name, data, timeout_s=self._timeout_s)
        log.info("shard_sizes_written", sizes=data["sizes"], created=stored is None)
        return True
