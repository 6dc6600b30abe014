"""Past one process, where a job is decided: its home shard (pure).

Each owner judges the reports of its own nodes' agents; a job whose pods run on nodes of
several shards would be judged in parts, its incident opened by each owner (one name, written
by each with its own part: a write ping-pong) and its attempts' first faults found on a part of
the job. So a job is decided by one owner only: the owner of its **home shard**,
``shard_of(job key, S)`` (:func:`gpuhealth.protocol.shards.shard_of`, the nodes' own hash).

- A report charged to a real job (not None, not :data:`~.blame.UNKNOWN_JOB`) whose home this
  replica does not own goes home (:meth:`JobHome.away`): the home owner counts it towards the
  job's incident and attempts. The report also stays where it was made: a GPU's own rules
  (faults under several jobs) are its node's owner's.
- Only the home owner opens the job's incident and finds its attempts (:meth:`JobHome.decides`).
- An attempt whose first fault is on a node the home owner does not own goes to that node's
  owner, which counts it towards the GPU's suspicion and blame as one of its own.

With one shard none of this exists: the judge has no :class:`JobHome`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpuhealth.controller.incidents.blame import UNKNOWN_JOB
from gpuhealth.protocol.shards import shard_of


def home_shard(job: str, count: int) -> int:
    """The shard that decides ``job`` (a job key, ``namespace/Kind/name``, or several joined
    with ``+`` when pods of several jobs shared the GPU)."""
    return shard_of(job, count)


def goes_home(job: str | None, owned: frozenset[int], count: int) -> int | None:
    """The home shard a report charged to ``job`` is sent to, None when it stays: no job, an
    unknown one, or a job homed in a shard of ``owned``."""
    if job is None or job == UNKNOWN_JOB:
        return None
    home = home_shard(job, count)
    return None if home in owned else home


@dataclass(frozen=True, slots=True)
class JobHome:
    """This replica's side of the rule: which shards it owns now and which nodes it serves."""

    count: int
    owned: Callable[[], frozenset[int]]
    """``ShardLeases.owned``."""
    serves: Callable[[str], bool]
    """Whether this replica owns a node now (``ShardOwner.serves``)."""

    def decides(self, job: str) -> bool:
        """This replica owns ``job``'s home shard: it opens its incident, finds its attempts."""
        return home_shard(job, self.count) in self.owned()

    def away(self, job: str | None) -> int | None:
        """:func:`goes_home` for the shards owned now."""
        return goes_home(job, self.owned(), self.count)
