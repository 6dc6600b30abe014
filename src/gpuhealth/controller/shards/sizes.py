"""The shards' sizes: the ConfigMap the singleton keeps, what the owners read of it, and each
owner's part of a fleet-wide limit (pure, but for :class:`ShardSizes`).

The singleton (:class:`~gpuhealth.controller.shards.labeller.ShardLabeller`) writes the GPU
nodes of each shard to the ConfigMap ``shards.sizes_configmap`` in the controller's namespace:
``data.count`` (the shard count ``S``) and ``data.sizes`` (a JSON list of ``S`` counts), only
when they change (:func:`sizes_data`). Every replica that may own shards reads it
(:class:`ShardSizes`, every ``shards.sizes_poll_interval_s``) and takes, of each fleet-wide
absolute limit (the breaker's ``min_nodes``, remediation's ``max_concurrent`` and
``max_unresolved_escalations``), the part of the shards it owns (:func:`part`): the sum of
:func:`~gpuhealth.controller.shards.assignment.split` over them, so that the parts of all the
owners add up to the whole, never more.

What the ConfigMap holds is checked (:func:`parse_sizes`): a count that is not this release's
``S`` (the singleton of another release version during an upgrade), a list of another length,
a negative or non-integer size, text that is not JSON: the content is refused with a log
(``shard_sizes_refused``) and the counter ``gpuhealth_shard_sizes_errors_total{reason}``, and
the last good sizes are kept.

While no sizes are known (nothing read yet, or nothing good ever read), an owner's part is
that of an even split: the whole divided as if every shard were the same size
(``split(total, [1] * S)``). Not the whole, since then ``S`` owners would each take the whole
(``S`` times the budget of disruptive writes across the fleet); not 0, since then a fleet with
the singleton's ConfigMap missing (its RBAC not there yet, the singleton down) would never
taint or remediate at all, the breaker's ``min_nodes`` floor included. The even split is exact
as every split is: across the shards it never adds up to more than the whole.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from prometheus_client import CollectorRegistry, Counter

from gpuhealth.common.clock import Clock
from gpuhealth.common.errors import PermanentError
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.kube.configmap import read_data
from gpuhealth.controller.kube.rest import ApiClient, KubeError
from gpuhealth.controller.shards.assignment import split

log = get_logger("shards")

Refusal = Literal["unreadable", "invalid", "count"]
"""Why sizes were not taken: the read failed, the content is damaged, it is for another
shard count."""


class SizesError(PermanentError):
    """The sizes ConfigMap's content is not sizes for this release's shard count."""

    def __init__(self, message: str, reason: Refusal) -> None:
        super().__init__(message)
        self.reason = reason


def sizes_data(count: int, sizes: Sequence[int]) -> dict[str, str]:
    """The ConfigMap's ``data`` for ``sizes`` of ``count`` shards."""
    return {"count": str(count), "sizes": json.dumps(list(sizes), separators=(",", ":"))}


def parse_sizes(data: Mapping[str, object], count: int) -> tuple[int, ...]:
    """The sizes ``data`` holds for ``count`` shards; :class:`SizesError` when it holds none
    (damaged, or written for another count)."""
    stored_count = data.get("count")
    if not isinstance(stored_count, str) or not stored_count.isdecimal():
        raise SizesError(f"count is not a number: {str(stored_count)[:40]!r}", "invalid")
    if int(stored_count) != count:
        raise SizesError(f"sizes of {int(stored_count)} shards, not {count}", "count")
    text = data.get("sizes")
    try:
        sizes = json.loads(text) if isinstance(text, str) else None
    except ValueError as exc:
        raise SizesError(f"sizes is not JSON: {exc}", "invalid") from exc
    if not isinstance(sizes, list) or not all(type(s) is int and s >= 0 for s in sizes):
        raise SizesError(f"sizes is not a list of counts: {str(text)[:80]!r}", "invalid")
    if len(sizes) != count:
        raise SizesError(f"{len(sizes)} sizes for {count} shards", "invalid")
    return tuple(sizes)


def part(total: int, sizes: Sequence[int] | None, owned: Iterable[int], *, count: int) -> int:
    """The part of the fleet-wide ``total`` that the owner of the shards ``owned`` (of
    ``count``) may use: the sum of their parts in ``split(total, sizes)``; with ``sizes`` not
    known (None, or not ``count`` of them), in an even split (see the module's docstring)."""
    weights = sizes if sizes is not None and len(sizes) == count else [1] * count
    parts = split(total, weights)
    return sum(parts[i] for i in set(owned) if 0 <= i < count)


class SizesMetrics:
    """``gpuhealth_shard_sizes_errors_total{reason}``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.errors = Counter(
            "gpuhealth_shard_sizes_errors",
            "Reads of the shard sizes ConfigMap not taken (the last good sizes kept), by reason: "
            "unreadable (the read failed), invalid (damaged content), count (another shard "
            "count's sizes)",
            ["reason"],
            registry=registry,
        )


class ShardSizes:
    """An owner's reader of the sizes ConfigMap: :meth:`run` (the named task
    ``shard-sizes``) reads it every ``poll_interval_s``; :meth:`part` is this owner's part of
    a fleet-wide limit from the last good sizes."""

    def __init__(
        self,
        api: ApiClient,
        namespace: str,
        name: str,
        count: int,
        *,
        poll_interval_s: float,
        timeout_s: float,
        clock: Clock,
        metrics: SizesMetrics | None = None,
    ) -> None:
        self._api = api
        self._namespace = namespace
        self._name = name
        self.count = count
        self._poll_interval_s = poll_interval_s
        self._timeout_s = timeout_s
        self._clock = clock
        self.metrics = metrics or SizesMetrics(None)
        self._sizes: tuple[int, ...] | None = None
        self._refused: str = ""
        """The last content refused (logged once until it changes)."""

    def sizes(self) -> tuple[int, ...] | None:
        """The GPU nodes of each shard as last read well; None while none was."""
        return self._sizes

    def part(self, total: int, owned: Iterable[int]) -> int:
        """The part of ``total`` of the owner of ``owned`` (:func:`part`)."""
        return part(total, self._sizes, owned, count=self.count)

    async def run(self) -> None:
        """Until cancelled: read the ConfigMap, then again every ``poll_interval_s``."""
        while True:
            await self.refresh()
            await self._clock.sleep(self._poll_interval_s)

    async def refresh(self) -> tuple[int, ...] | None:
        """Read the ConfigMap once; the sizes known afterwards (the last good ones when this
        read failed or was refused)."""
        try:
            data = await read_data(
                self._api, self._namespace, self._name, timeout_s=self._timeout_s
            )
        except KubeError as exc:
            self.metrics.errors.labels("unreadable").inc()
            log.warning("shard_sizes_unreadable", error=str(exc), status=exc.status)
            return self._sizes
        if data is None:
            return self._sizes  # not written yet (or deleted): what was known stays
        try:
            sizes = parse_sizes(data, self.count)
        except SizesError as exc:
            self.metrics.errors.labels(exc.reason).inc()
            if str(exc) != self._refused:
                log.warning(
                    "shard_sizes_refused", reason=exc.reason, error=str(exc), kept=self._sizes
                )
                self._refused = str(exc)
            return self._sizes
        self._refused = ""
        if sizes != self._sizes:
            log.info("shard_sizes_read", sizes=list(sizes))
            self._sizes = sizes
        return sizes
