"""What the health engine emits: a GPU's state changed, or an XID arrived.

The engine driver (:mod:`gpuhealth.agent.engine_driver`) hands each to its listeners: the stream
client turns it into a protocol ``Event`` in its outbox.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from gpuhealth.protocol import Condition, HealthState


@dataclass(frozen=True, slots=True)
class Transition:
    """A GPU's state changed, or an XID arrived (``kind == "xid"``) without changing it."""

    kind: Literal["transition", "xid"]
    uuid: str
    index: int
    previous: HealthState
    current: HealthState
    conditions: tuple[Condition, ...]
    at: datetime
    xid: int | None = None
    detail: str = ""
    """With ``xid``: the driver's text of the line (:func:`~.conditions.xid_detail`)."""
