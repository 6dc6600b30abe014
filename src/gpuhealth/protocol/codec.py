"""Binary framing: one msgpack-encoded message per WebSocket binary frame.

The unions a side decodes are v1's messages plus the remediation messages
(:mod:`gpuhealth.protocol.remediation`): their tags are distinct, so one decoder tells them apart.
"""

from __future__ import annotations

from typing import Any

import msgspec

from gpuhealth.protocol.frames import MAX_FRAME_BYTES, ProtocolError
from gpuhealth.protocol.remediation import ActionReport, Order
from gpuhealth.protocol.v1 import AgentMessage, ControllerMessage, Message

__all__ = [
    "MAX_FRAME_BYTES",
    "AgentFrame",
    "AnyFrame",
    "ControllerFrame",
    "ProtocolError",
    "decode",
    "decode_agent",
    "decode_controller",
    "encode",
]

AgentFrame = AgentMessage | ActionReport
"""Every frame an agent sends: v1's messages and the remediation loop's action reports."""
ControllerFrame = ControllerMessage | Order
"""Every frame the controller sends: v1's Ack and Error, and remediation orders."""
AnyFrame = Message | ActionReport | Order

_encoder = msgspec.msgpack.Encoder()
_any = msgspec.msgpack.Decoder(AnyFrame)
_agent = msgspec.msgpack.Decoder(AgentFrame)
_controller = msgspec.msgpack.Decoder(ControllerFrame)


def encode(msg: AnyFrame) -> bytes:
    return _encoder.encode(msg)


def _decode(decoder: msgspec.msgpack.Decoder[Any], data: bytes) -> AnyFrame:
    if len(data) > MAX_FRAME_BYTES:
        raise ProtocolError("too-large", f"frame of {len(data)} bytes exceeds {MAX_FRAME_BYTES}")
    try:
        msg: AnyFrame = decoder.decode(data)
        return msg
    except msgspec.ValidationError as exc:
        raise ProtocolError("malformed", f"invalid message: {exc}") from exc
    except (msgspec.DecodeError, ValueError) as exc:
        # ValueError: e.g. UnicodeDecodeError for a str that is not UTF-8 (found by fuzzing)
        raise ProtocolError("malformed", f"undecodable frame: {exc}") from exc


def decode(data: bytes) -> AnyFrame:
    return _decode(_any, data)


def decode_agent(data: bytes) -> AgentFrame:
    return _decode(_agent, data)  # type: ignore[return-value]


def decode_controller(data: bytes) -> ControllerFrame:
    return _decode(_controller, data)  # type: ignore[return-value]
