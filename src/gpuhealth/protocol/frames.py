"""The frame limit and the error every decoder raises (shared by :mod:`gpuhealth.protocol.codec` and
:mod:`gpuhealth.protocol.remediation`, which the codec's unions include)."""

from __future__ import annotations

MAX_FRAME_BYTES = 1 << 20
"""Largest frame either side accepts (1 MiB): a full 64-GPU snapshot is well under 100 KiB."""


class ProtocolError(ValueError):
    """A frame that is not a valid message. ``code`` maps to ``ErrorCode``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
