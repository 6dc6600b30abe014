"""gpuhealth's own error types: transient (retry) versus permanent (give up, report)."""

from __future__ import annotations


class GpuHealthError(Exception):
    """Base of every error gpuhealth raises on purpose. Chain the library cause with ``from``."""


class TransientError(GpuHealthError):
    """Worth retrying: a timeout, a 5xx, a conflict, a dropped connection."""


class PermanentError(GpuHealthError):
    """Retrying will not help: bad configuration, a forbidden request, malformed input."""


class ConfigError(PermanentError):
    """A configuration or scenario file is invalid; the message names the file, line and field."""
