"""Wire messages shared by agent and controller (msgspec structs), and the one severity order of
their health states. Nothing else lives here."""

if not __name__.startswith("gpuhealth."):  # the repository root on sys.path: a second copy
    raise ImportError(
        f"import gpuhealth.{__name__}, not {__name__} (docs/architecture.md, Packaging)"
    )


from gpuhealth.protocol.codec import MAX_FRAME_BYTES, ProtocolError, decode, encode
from gpuhealth.protocol.v1 import (
    HEALTH_STATES,
    NODE_HEADER,
    PROTOCOL_VERSION,
    Ack,
    AgentMessage,
    Allocation,
    AllocationUsage,
    Condition,
    ControllerMessage,
    Error,
    ErrorCode,
    Event,
    GpuInfo,
    GpuStatus,
    GpuTelemetry,
    HealthState,
    Heartbeat,
    Hello,
    Message,
    MigDeviceInfo,
    Snapshot,
    retry_after_from_header,
    retry_after_header,
    severity,
    worst_state,
)

__all__ = [
    "HEALTH_STATES",
    "MAX_FRAME_BYTES",
    "NODE_HEADER",
    "PROTOCOL_VERSION",
    "Ack",
    "AgentMessage",
    "Allocation",
    "AllocationUsage",
    "Condition",
    "ControllerMessage",
    "Error",
    "ErrorCode",
    "Event",
    "GpuInfo",
    "GpuStatus",
    "GpuTelemetry",
    "HealthState",
    "Heartbeat",
    "Hello",
    "Message",
    "MigDeviceInfo",
    "ProtocolError",
    "Snapshot",
    "decode",
    "encode",
    "retry_after_from_header",
    "retry_after_header",
    "severity",
    "worst_state",
]
