"""The other shards' placement scores, past one process.

kube-scheduler asks any replica about every node; a replica's :class:`PlacementIndex` holds
only its shards' nodes. Every ``extender.peer_summary_refresh_s`` :class:`PeerScores` (the
named task ``extender-peer-scores``) asks each other shard's owner for its scores
(``GET /scheduler/scores?scope=local``: node -> score, and the shards it holds) and keeps
them per owner; :meth:`PeerScores.scores` offers only those at most
``extender.peer_summary_max_age_s`` old. An owner that does not answer leaves its nodes
without a score once that age is past: prioritize then gives them ``unknown_node_score``
(neutral), and the filter never fails for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpuhealth.common.clock import Clock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.placement.settings import ExtenderSettings
from gpuhealth.controller.shards.merge import held_shards
from gpuhealth.controller.shards.peers import ShardAnswer

log = get_logger("extender.peers")

SCORES_PATH = "/scheduler/scores"


class OwnerReader(Protocol):
    """The shards' owners (:class:`~gpuhealth.controller.shards.peers.ShardPeers`)."""

    @property
    def count(self) -> int: ...

    async def ask_owners(
        self, shards: Sequence[int], path: str, params: Sequence[tuple[str, str]]
    ) -> list[ShardAnswer]: ...


def scores_json(scores: Mapping[str, int], owned: frozenset[int]) -> dict[str, Any]:
    """What ``GET /scheduler/scores`` answers: this replica's node scores, its shards."""
    return {"shards": sorted(owned), "scores": dict(scores)}


def read_scores(body: Mapping[str, Any]) -> dict[str, int]:
    """The scores of an owner's answer (malformed entries dropped; pure)."""
    raw = body.get("scores")
    if not isinstance(raw, Mapping):
        return {}
    return {
        str(k): v
        for k, v in raw.items()
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 10
    }


@dataclass(frozen=True, slots=True)
class _Fetched:
    at: float
    scores: dict[str, int]


class PeerScores:
    def __init__(
        self,
        peers: OwnerReader,
        owned: Callable[[], frozenset[int]],
        settings: ExtenderSettings,
        *,
        clock: Clock,
    ) -> None:
        self._peers = peers
        self._owned = owned
        self.settings = settings
        self._clock = clock
        self._by_shard: dict[int, _Fetched] = {}
        self._merged: dict[str, int] = {}
        self._merged_until = 0.0

    async def refresh(self) -> None:
        """Every other shard's owner asked once; what answered replaces what it held."""
        owned = self._owned()
        others = [i for i in range(self._peers.count) if i not in owned]
        answers = await self._peers.ask_owners(others, SCORES_PATH, ())
        now = self._clock.monotonic()
        for answer in answers:
            if answer.body is None:
                log.info(
                    "extender_peer_scores_unavailable", shards=answer.shards, why=answer.reason
                )
                continue
            fetched = _Fetched(now, read_scores(answer.body))
            for shard in held_shards(answer.body, self._peers.count):
                self._by_shard[shard] = fetched
        for shard in owned:
            self._by_shard.pop(shard, None)
        self._merged_until = 0.0

    def scores(self) -> Mapping[str, int]:
        """The other shards' node scores at most ``peer_summary_max_age_s`` old."""
        now = self._clock.monotonic()
        if now < self._merged_until:
            return self._merged
        max_age = self.settings.peer_summary_max_age_s
        fresh = {id(f): f for f in self._by_shard.values() if now - f.at <= max_age}
        merged: dict[str, int] = {}
        for f in fresh.values():
            merged.update(f.scores)
        self._merged = merged
        self._merged_until = min((f.at + max_age for f in fresh.values()), default=float("inf"))
        return merged

    async def run(self) -> None:
        """The named task ``extender-peer-scores``: refresh, forever."""
        while True:
            try:
                await self.refresh()
            except Exception:  # never ends the task: stale scores expire on their own
                log.exception("extender_peer_scores_failed")
            await self._clock.sleep(self.settings.peer_summary_refresh_s)
