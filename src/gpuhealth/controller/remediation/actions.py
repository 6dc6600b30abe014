"""What a step asks the runner to do, as values (:class:`Quarantine`, :class:`Evict`,
:class:`SendOrder` ...): the runner carries them out after the hard-write gate allowed the
disruptive ones (:func:`hard_write`, :func:`hard_writes`: one gate request per kind and node
they land on)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from gpuhealth.controller.breaker.gate import HardWrite
from gpuhealth.controller.remediation.drain import Eviction
from gpuhealth.controller.remediation.facts import PodFacts
from gpuhealth.controller.remediation.model import Episode
from gpuhealth.controller.remediation.orders import ORDER_KINDS, OrderKind
from gpuhealth.controller.remediation.settings import ReplaceMethod
from gpuhealth.protocol.remediation import Order

WriteKind = Literal["quarantine", "evict", "force-delete", "reset-gpu", "reboot", "replace-node"]


@dataclass(frozen=True, slots=True)
class Quarantine:
    node: str


@dataclass(frozen=True, slots=True)
class Evict:
    eviction: Eviction


@dataclass(frozen=True, slots=True)
class ForceDelete:
    pod: PodFacts


@dataclass(frozen=True, slots=True)
class SendOrder:
    """A protocol order for the node's agent, built by the step (``seq`` :data:`UNNUMBERED`)."""

    order: Order

    @property
    def kind(self) -> OrderKind:
        return ORDER_KINDS[type(self.order)]


@dataclass(frozen=True, slots=True)
class CreateValidationPod:
    name: str
    node: str


@dataclass(frozen=True, slots=True)
class SetNodeLabel:
    node: str
    key: str
    value: str | None


@dataclass(frozen=True, slots=True)
class ReplaceNode:
    """Ask for the node's replacement: delete its Karpenter NodeClaim (``method: nodeclaim``)
    or the Node (``node``), each checked again right before the delete and guarded by its UID.
    The episode's status says ``Requested`` before the delete is sent (written ahead)."""

    node: str
    node_uid: str
    method: ReplaceMethod
    pool: str
    node_claim: str = ""
    node_claim_uid: str = ""
    again: bool = False
    """Sent again after a pass that wrote ``Requested`` did not record what the delete did (a
    crash, a lost answer): a NodeClaim or Node gone by now was deleted by that pass."""


Act = (
    Quarantine | Evict | ForceDelete | SendOrder | CreateValidationPod | SetNodeLabel | ReplaceNode
)


def hard_write(act: Act) -> WriteKind | None:
    """The kind of disruptive write an action is (None: not disruptive)."""
    if isinstance(act, Quarantine):
        return "quarantine"
    if isinstance(act, Evict):
        return "evict"
    if isinstance(act, ForceDelete):
        return "force-delete"
    if isinstance(act, SendOrder) and act.kind in ("reset-gpu", "reboot"):
        return act.kind
    if isinstance(act, ReplaceNode):
        return "replace-node"
    return None


def _landing(act: Act, node: str) -> str:
    if isinstance(act, Evict):
        return act.eviction.pod.node or node
    if isinstance(act, ForceDelete):
        return act.pod.node or node
    return node


def hard_writes(ep: Episode, actions: Sequence[Act]) -> list[HardWrite]:
    """One gate request per (kind, node) the step's disruptive actions land on: the
    episode's node first, then the other nodes (gang members) by name."""
    count: dict[tuple[WriteKind, str], int] = {}
    for act in actions:
        kind = hard_write(act)
        if kind is not None:
            key = (kind, _landing(act, ep.node))
            count[key] = count.get(key, 0) + 1
    keys = sorted(count, key=lambda k: (k[1] != ep.node, k[1], k[0]))
    return [
        HardWrite(node=node, kind=kind, episode=ep.name, detail=f"{count[kind, node]} action(s)")
        for kind, node in keys
    ]
