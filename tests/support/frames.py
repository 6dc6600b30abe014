"""Raw agent frames for stream tests (unit and integration)."""

from __future__ import annotations

from datetime import UTC, datetime

from gpuhealth.protocol import Event, Hello, encode

AT = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)


def hello_frame(node: str = "node-a", seq: int = 1, stream: str = "s1", protocol: int = 1) -> bytes:
    return encode(
        Hello(
            seq=seq, node=node, stream_id=stream, boot_id="b", agent_version="t", protocol=protocol
        )
    )


def event_frame(seq: int, node: str = "node-a") -> bytes:
    """An XID event that changes nothing; ``xid`` equals ``seq`` so order is visible."""
    return encode(
        Event(
            seq=seq,
            node=node,
            at=AT,
            kind="xid",
            gpu_uuid="GPU-0",
            gpu_index=0,
            previous="healthy",
            current="healthy",
            xid=seq,
        )
    )
