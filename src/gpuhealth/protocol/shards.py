"""Which shard a node belongs to: the contract between the agent and the controller past one
process (docs/architecture.md, "Past one process").

A release with ``S`` shards cuts its nodes by :func:`shard_of`: a stable hash (SHA-256, not
Python's salted ``hash``), the same in every replica and every agent, in any process, on any
version. The key is the node's name, or its NVLink domain where it has one (the controller's
singleton decides and writes the Node's shard label, so that a domain is never split); an agent
asks the shard of its name first, and a replica that does not own it answers HTTP 503 with
:data:`SHARD_HEADER` naming the shard that does.
"""

from __future__ import annotations

import hashlib

from gpuhealth.protocol.frames import ProtocolError

MAX_SHARDS = 64
"""Most shards a release may have (the chart's ``shards.count``): at 5,000 nodes a shard,
320,000 nodes."""

SHARD_HEADER = "Gpuhealth-Shard"
"""Response header of a stream upgrade turned away because this replica does not own the
node's shard: the shard that owns it (absent: not known here; the agent keeps its own)."""

SHARD_PLACEHOLDER = "{shard}"
"""Where an agent's ``controller_url`` names the shard it dials (the chart renders
``wss://<release>-controller-shard-{shard}.<namespace>.svc:<port>/v1/stream``)."""


def shard_url(template: str, shard: int) -> str:
    """``template`` with every :data:`SHARD_PLACEHOLDER` replaced by ``shard`` (a URL without
    one is every shard's)."""
    return template.replace(SHARD_PLACEHOLDER, str(shard))


def shard_from_header(value: str | None, count: int) -> int | None:
    """The shard a :data:`SHARD_HEADER` names among ``count``; None when the header is absent.
    Anything but a plain decimal in ``0..count-1`` is a :class:`ProtocolError` (the agent
    ignores it and keeps the shard it has)."""
    if value is None:
        return None
    text = value.strip()
    if not text.isascii() or not text.isdigit() or len(text) > 8:
        raise ProtocolError("malformed", f"{SHARD_HEADER} {value[:32]!r} is not a shard number")
    shard = int(text)
    if shard >= count:
        raise ProtocolError("malformed", f"{SHARD_HEADER} {shard} is outside 0..{count - 1}")
    return shard


def shard_of(key: str, count: int) -> int:
    """The shard of ``key`` (a node's name, or its domain) among ``count``: the first 8 bytes
    of the SHA-256 of ``key``, as an unsigned big-endian integer, modulo ``count``."""
    if not 1 <= count <= MAX_SHARDS:
        raise ValueError(f"shard count {count} is outside 1..{MAX_SHARDS}")
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:8], "big") % count
