"""The seam between the stream server and fleet state.

The stream server authenticates a connection, decodes frames, drops duplicates by sequence
number, and calls an :class:`IngestSink` with each new message; the fleet implements it.
Calls happen on the event loop and must not block.
"""

from __future__ import annotations

from typing import Protocol

from gpuhealth.protocol import Event, Heartbeat, Hello, Snapshot


class IngestSink(Protocol):
    def on_connect(self, node: str, hello: Hello) -> None:
        """An authenticated agent said Hello (a reconnect replaces the older connection)."""

    def on_message(self, node: str, msg: Snapshot | Event | Heartbeat) -> None:
        """A message not seen before, in sequence order for that node's stream."""

    def on_disconnect(self, node: str) -> None:
        """The node's live connection closed (not called when replaced by a newer one)."""
