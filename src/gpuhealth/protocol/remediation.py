"""Remediation messages on the agent stream: controller orders, agent action reports.

The controller orders, the agent acts and reports; the agent never writes to Kubernetes.

Controller -> agent: :class:`ResetGpuOrder`, :class:`RebootOrder`, :class:`ValidateOrder`,
:class:`CancelOrder`. ``order_id`` names one attempt of one action of one episode and is
derived from the episode's status (``<fingerprint>-<action>-<attempt>``), so an order the
controller sends again after a restart or a reconnect has the same id: the agent executes
an order id at most once and answers a repeat with the result it already has. ``seq``
counts the orders sent on one connection (from 1); the agent drops a frame whose ``seq`` is
not above the last one it saw on that connection (a duplicated frame).

Agent -> controller: :class:`ActionReport`, sent through the agent's outbox like every
other agent message, so ``seq`` is the outbox sequence number and a report survives a
reconnect or a reboot (a reboot order is reported ``accepted`` before the node goes down;
completion is the new boot id in the next Hello).

Every string and list is bounded, as in :mod:`gpuhealth.protocol.v1`. The stream's unions
(:mod:`gpuhealth.protocol.codec`: ``ControllerFrame``, ``AgentFrame``) include the orders and the
report (their tags are distinct from v1's).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal, TypeVar

import msgspec
from msgspec import Meta, Struct

from gpuhealth.protocol.frames import MAX_FRAME_BYTES, ProtocolError
from gpuhealth.protocol.v1 import MAX_CONDITIONS, MAX_GPUS, LabelValue, Name, Seq, ShortStr, Text

OrderId = Annotated[
    str, Meta(min_length=1, max_length=64, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
]
"""``<fingerprint>-<action>-<attempt>``: lower-case letters, digits and dashes."""
GpuUuid = Annotated[str, Meta(min_length=1, max_length=128)]
DeadlineS = Annotated[float, Meta(gt=0.0, le=86400.0)]
SoakS = Annotated[float, Meta(ge=0.0, le=86400.0)]

MAX_PROCESSES = 64
MAX_CHECKS = 64

ActionKind = Literal["reset-gpu", "reboot", "validate", "cancel"]
ReportState = Literal["accepted", "running", "succeeded", "failed", "refused"]
"""``accepted``: will act (a reboot's last word); ``running``: still working (validation soak);
``succeeded`` / ``failed``: done; ``refused``: did nothing, ``reason`` says why."""


class ResetGpuOrder(Struct, frozen=True, kw_only=True, tag="order-reset-gpu"):
    """Reset these GPUs once no process uses them (refused with ``gpu-busy`` otherwise)."""

    seq: Seq
    order_id: OrderId
    episode: Name
    issued_at: datetime
    deadline_s: DeadlineS
    gpus: Annotated[list[GpuUuid], Meta(min_length=1, max_length=MAX_GPUS)]


class RebootOrder(Struct, frozen=True, kw_only=True, tag="order-reboot"):
    """Reboot the node, but only if it still runs the boot ``expected_boot_id`` (a repeated
    order after the reboot is refused with ``boot-id-changed`` instead of rebooting again)."""

    seq: Seq
    order_id: OrderId
    episode: Name
    issued_at: datetime
    deadline_s: DeadlineS
    expected_boot_id: Annotated[str, Meta(min_length=1, max_length=128)]
    reason: Text = ""


class ValidateOrder(Struct, frozen=True, kw_only=True, tag="order-validate"):
    """Check these GPUs: reachable through NVML, none of ``signals`` (condition codes the
    verdict came from) present, healthy for ``soak_s`` without a break, and (with
    ``diagnostic``) the diagnostic hook passes."""

    seq: Seq
    order_id: OrderId
    episode: Name
    issued_at: datetime
    deadline_s: DeadlineS
    gpus: Annotated[list[GpuUuid], Meta(min_length=1, max_length=MAX_GPUS)]
    signals: Annotated[list[LabelValue], Meta(max_length=MAX_CONDITIONS)] = []
    soak_s: SoakS = 0.0
    diagnostic: bool = False


class CancelOrder(Struct, frozen=True, kw_only=True, tag="order-cancel"):
    """Stop a running order (an aborted episode's validation soak); a finished one stays."""

    seq: Seq
    order_id: OrderId
    episode: Name
    issued_at: datetime
    cancel_order_id: OrderId


class GpuProcess(Struct, frozen=True, kw_only=True):
    """A process NVML lists on a GPU (why a reset was refused)."""

    gpu_uuid: GpuUuid
    pid: Annotated[int, Meta(ge=0, le=2**31 - 1)]
    name: ShortStr = ""


class CheckResult(Struct, frozen=True, kw_only=True):
    """One validation check: ``nvml``, ``signal:<code>``, ``soak``, ``diagnostic`` ..."""

    name: ShortStr
    passed: bool
    message: Text = ""


class ActionReport(Struct, frozen=True, kw_only=True, tag="action-report"):
    seq: Seq
    node: Name
    order_id: OrderId
    episode: Name
    action: ActionKind
    state: ReportState
    at: datetime
    boot_id: ShortStr = ""
    reason: Annotated[str, Meta(max_length=63, pattern=r"^[a-z0-9-]*$")] = ""
    """A short code: ``gpu-busy``, ``boot-id-changed``, ``no-executor``, ``unknown-gpu``,
    ``mig-enabled``, ``command-failed``, ``timeout``, ``validation-failed`` ..."""
    message: Text = ""
    processes: Annotated[list[GpuProcess], Meta(max_length=MAX_PROCESSES)] = []
    checks: Annotated[list[CheckResult], Meta(max_length=MAX_CHECKS)] = []


Order = ResetGpuOrder | RebootOrder | ValidateOrder | CancelOrder
T = TypeVar("T")

_encoder = msgspec.msgpack.Encoder()
_orders: msgspec.msgpack.Decoder[Order] = msgspec.msgpack.Decoder(Order)
_reports = msgspec.msgpack.Decoder(ActionReport)


def encode(msg: Order | ActionReport) -> bytes:
    return _encoder.encode(msg)


def _decode(decoder: msgspec.msgpack.Decoder[T], data: bytes) -> T:
    if len(data) > MAX_FRAME_BYTES:
        raise ProtocolError("too-large", f"frame of {len(data)} bytes exceeds {MAX_FRAME_BYTES}")
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise ProtocolError("malformed", f"invalid message: {exc}") from exc
    except (msgspec.DecodeError, ValueError) as exc:
        raise ProtocolError("malformed", f"undecodable frame: {exc}") from exc


def decode_order(data: bytes) -> Order:
    """An order from the controller, or :class:`ProtocolError`."""
    order: Order = _decode(_orders, data)
    return order


def decode_report(data: bytes) -> ActionReport:
    """An agent's action report, or :class:`ProtocolError`."""
    return _decode(_reports, data)
