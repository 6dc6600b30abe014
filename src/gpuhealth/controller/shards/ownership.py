"""Which shards' Leases a replica campaigns for (pure).

Shard ``i`` is owned through its own Lease (``<lease_name>-shard-<i>``), taken, renewed, lost
and released exactly as the one Lease (:mod:`gpuhealth.controller.leadership.election`). Which
ones a replica asks for is decided here, from what it last saw of every shard's Lease
(:class:`ShardView`):

- it keeps every shard it holds (it never gives one up while it runs: a handover moves that
  shard's agents, and nothing is gained by moving them twice);
- it asks for a free shard (nobody holds it, or its holder stopped renewing it) while it holds
  fewer than its fair share, ``ceil(S / replicas)``, the lowest-numbered first, so that the
  replicas of a release split the shards between them;
- it asks for any shard that has been free for ``takeover_after_s`` (the replica meant to take
  it did not: a spare, or a replica covering for a lost one), so that no shard stays without an
  owner for longer than that, whatever the replicas' count;
- on a clean shutdown it releases what it holds, and the others take it at once (up to their
  share) or after ``takeover_after_s``.

Two replicas asking for the same free shard race on its resourceVersion: one wins, the other
sees it held. A replica added later holds nothing until shards become free (a rolling restart
releases them one replica at a time): shards never move only to balance the count.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ShardView:
    """One shard's Lease as a replica last saw it."""

    shard: int
    holder: str
    """Its holder, empty when nobody holds it (never created, or released)."""
    live: bool
    """Its holder renewed it within its lease duration (as observed on this replica's clock)."""
    free_for_s: float = 0.0
    """For how long it has been free (no holder, or its holder no longer live), as observed."""

    @property
    def free(self) -> bool:
        return not self.holder or not self.live


def fair_share(count: int, replicas: int) -> int:
    """The most shards a replica asks for while none is left free for long."""
    return math.ceil(count / max(1, replicas))


def to_campaign(
    views: Iterable[ShardView], me: str, *, replicas: int, takeover_after_s: float
) -> frozenset[int]:
    """The shards ``me`` asks for now: those it holds, free ones up to its fair share, and
    any free for ``takeover_after_s``."""
    views = sorted(views, key=lambda v: v.shard)
    share = fair_share(len(views), replicas)
    want = {v.shard for v in views if v.holder == me and v.live}
    for v in views:
        if not v.free or v.shard in want:
            continue
        if len(want) < share or v.free_for_s >= takeover_after_s:
            want.add(v.shard)
    return frozenset(want)
