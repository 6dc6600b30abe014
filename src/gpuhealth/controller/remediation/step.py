"""One step of the state machine: what a phase is given besides the episode and what it
observed (:class:`Context`), and what it returns (:class:`Step`: the new status, the actions,
the Events to post as :class:`Note`, when to look again)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from gpuhealth.controller.names import Keys
from gpuhealth.controller.remediation.actions import Act
from gpuhealth.controller.remediation.model import Episode, Phase, Status
from gpuhealth.controller.remediation.settings import RemediationSettings


@dataclass(frozen=True, slots=True)
class Context:
    settings: RemediationSettings
    keys: Keys
    history: tuple[Episode, ...] = ()
    """The node's other episodes (for :func:`fault.verify`)."""


@dataclass(frozen=True, slots=True)
class Note:
    """An Event to post about the episode (and, with ``node``, about its Node too)."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str
    node: bool = False


@dataclass(frozen=True, slots=True)
class Step:
    status: Status
    actions: tuple[Act, ...] = ()
    notes: tuple[Note, ...] = ()
    requeue_after_s: float | None = None
    transitions: tuple[tuple[Phase, Phase], ...] = field(default=())
