"""Binary framing: one msgpack-encoded message per WebSocket binary frame."""

from __future__ import annotations

from typing import Any

import msgspec

from gpuhealth.protocol.v1 import AgentMessage, ControllerMessage, Message

MAX_FRAME_BYTES = 1 << 20
"""Largest frame either side accepts (1 MiB): a full 64-GPU snapshot is well under 100 KiB."""


class ProtocolError(ValueError):
    """A frame that is not a valid v1 message. ``code`` maps to ``ErrorCode``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


_encoder = msgspec.msgpack.Encoder()
_any = msgspec.msgpack.Decoder(Message)
_agent = msgspec.msgpack.Decoder(AgentMessage)
_controller = msgspec.msgpack.Decoder(ControllerMessage)


def encode(msg: Message) -> bytes:
    return _encoder.encode(msg)


def _decode(decoder: msgspec.msgpack.Decoder[Any], data: bytes) -> Message:
    if len(data) > MAX_FRAME_BYTES:
        raise ProtocolError("too-large", f"frame of {len(data)} bytes exceeds {MAX_FRAME_BYTES}")
    try:
        msg: Message = decoder.decode(data)
        return msg
    except msgspec.ValidationError as exc:
        raise ProtocolError("malformed", f"invalid message: {exc}") from exc
    except (msgspec.DecodeError, ValueError) as exc:
        # ValueError: e.g. UnicodeDecodeError for a str that is not UTF-8 (found by fuzzing)
        raise ProtocolError("malformed", f"undecodable frame: {exc}") from exc


def decode(data: bytes) -> Message:
    return _decode(_any, data)


def decode_agent(data: bytes) -> AgentMessage:
    return _decode(_agent, data)  # type: ignore[return-value]


def decode_controller(data: bytes) -> ControllerMessage:
    return _decode(_controller, data)  # type: ignore[return-value]
