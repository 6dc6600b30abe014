"""Which controller URL the agent dials past one process (docs/architecture.md, "Past one
process"): its shard's.

With ``controller_shards`` = S > 1 the ``controller_url`` holds ``{shard}`` and each shard has
its own Service, whose endpoint is that shard's owner. The agent starts with the shard of its
node's name (:func:`gpuhealth.protocol.shards.shard_of`); a node in an NVLink domain belongs to
its domain's shard instead, and the replica it reached then answers the upgrade with HTTP 503
naming that shard in :data:`gpuhealth.protocol.shards.SHARD_HEADER`: the agent dials that
shard from then on. With S = 1 (the default) every ``{shard}`` is 0 and nothing ever moves.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuhealth.protocol.shards import shard_from_header, shard_of, shard_url


@dataclass
class ShardRoute:
    """The URL template, the shard count and the shard the agent dials now."""

    template: str
    count: int
    shard: int

    @classmethod
    def for_node(cls, template: str, count: int, node: str) -> ShardRoute:
        """The first shard: the one of the node's name."""
        return cls(template, count, shard_of(node, count))

    @property
    def url(self) -> str:
        return shard_url(self.template, self.shard)

    def follow(self, header: str | None) -> bool:
        """Dial the shard a refusal's shard header names from now on; True when that moved
        the agent. An absent header keeps the shard; one that names no shard of ``count``
        raises :class:`gpuhealth.protocol.ProtocolError` and keeps it too."""
        named = shard_from_header(header, self.count)
        if named is None or named == self.shard:
            return False
        self.shard = named
        return True
