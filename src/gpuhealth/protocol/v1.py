"""Protocol v1: the messages on the agent -> controller WebSocket.

Agent -> controller: Hello, Snapshot, Event, Heartbeat. Controller -> agent: Ack, Error.
Every agent message carries ``seq``: a per-stream counter that starts at 1 and only grows.
A stream is named by ``Hello.stream_id`` (created with the agent's on-disk outbox); the
controller keeps the highest sequence applied per (node, stream_id) and ignores anything at
or below it, which makes replay after a reconnect idempotent. ``Ack.seq`` is cumulative.

Every string and list is bounded so that a hostile or broken peer cannot make the other side
allocate without limit; the codec rejects a frame that breaks any bound.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal

from msgspec import Meta, Struct

PROTOCOL_VERSION = 1

HealthState = Literal["healthy", "degraded", "unhealthy", "unknown"]

HEALTH_STATES: tuple[HealthState, ...] = ("healthy", "degraded", "unknown", "unhealthy")
"""Every health state, best to worst: the one severity order of agent and controller.

``unknown`` (nobody can vouch for the GPU: no sample yet, stale data, a silent agent) ranks
above ``degraded`` (known to work, impaired) and below ``unhealthy`` (known broken): an unknown
GPU is not placed on, and an operator should look at it before a degraded one."""

_RANK: dict[str, int] = {s: i for i, s in enumerate(HEALTH_STATES)}


def severity(state: str) -> int:
    """The rank of ``state`` in :data:`HEALTH_STATES` (0 = healthy); an unrecognised string
    ranks as ``unknown``."""
    return _RANK.get(state, _RANK["unknown"])


def worst_state(states: Iterable[HealthState], default: HealthState = "healthy") -> HealthState:
    """The worst of ``states`` by :func:`severity`; ``default`` when there are none."""
    worst = default
    for s in states:
        if severity(s) > severity(worst):
            worst = s
    return worst


Name = Annotated[str, Meta(min_length=1, max_length=253)]
ShortStr = Annotated[str, Meta(max_length=128)]
Text = Annotated[str, Meta(max_length=1024)]
LabelValue = Annotated[
    str, Meta(max_length=63, pattern=r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
]
Seq = Annotated[int, Meta(ge=1, le=2**63 - 1)]
Ratio = Annotated[float, Meta(ge=0.0, le=1.0)]
GpuIndex = Annotated[int, Meta(ge=0, le=1023)]

MAX_GPUS = 64
MAX_CONDITIONS = 32
MAX_ALLOCATIONS = 1024


class Condition(Struct, frozen=True, kw_only=True):
    """One reason a GPU is not healthy.

    ``reason`` is CamelCase (``XidError``, ``EccUncorrectable``, ``GpuLost`` ...); ``code`` is
    the short label-value form used in taint values (``xid-79``, ``ecc-dbe``, ``gpu-lost``).
    """

    reason: ShortStr
    code: LabelValue
    severity: HealthState
    message: Text = ""
    action: ShortStr = "NONE"
    xid: int | None = None
    since: datetime | None = None
    gpu_instance: Annotated[int, Meta(ge=0, le=65535)] | None = None
    """MIG GPU instance the fault was attributed to (kernel log ``GPU-I:``); None = whole GPU
    or not known. Added in 0.2; older peers ignore it."""
    compute_instance: Annotated[int, Meta(ge=0, le=65535)] | None = None
    """MIG compute instance within ``gpu_instance`` (``GPU-CI:``)."""
    scope: ShortStr | None = None
    """The fault's impact scope where the driver says it (GPU Operational Events): ``gpu``,
    ``gpu-instance``, ``compute-instance``, ``node``, ``nvlink-domain``; ``rail`` for the
    ``rail-*`` conditions (the fault is the network port's beside the GPU, named in the
    message and in ``Snapshot.nics``); None = the GPU (not known). Added in 0.3; older peers
    ignore it."""


MAX_MIG_DEVICES = 16


class MigDeviceInfo(Struct, frozen=True, kw_only=True):
    """A MIG device of a GPU in MIG mode: the UUID the device plugin and DRA name it by."""

    uuid: Name
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


class GpuInfo(Struct, frozen=True, kw_only=True, gc=False):
    """A GPU's identity (``gc=False``: the controller keeps one per GPU of the fleet and it
    refers to nothing that refers back, so the garbage collector need not walk it)."""

    index: GpuIndex
    uuid: Name
    pci_bus_id: ShortStr = ""
    model: ShortStr = ""
    serial: ShortStr | None = None
    memory_total_bytes: int | None = None
    mig_enabled: bool = False
    mig_devices: Annotated[list[MigDeviceInfo], Meta(max_length=MAX_MIG_DEVICES)] = []
    """The GPU's MIG devices (MIG UUID -> this parent GPU); empty outside MIG mode and from
    older agents."""


class GpuTelemetry(Struct, frozen=True, kw_only=True):
    """A per-GPU summary used for placement (prioritize) and dashboards. ``None`` = not reported."""

    uuid: Name
    temperature_c: float | None = None
    slowdown_temperature_c: float | None = None
    shutdown_temperature_c: float | None = None
    power_w: float | None = None
    utilization_ratio: Ratio | None = None
    memory_bandwidth_ratio: Ratio | None = None
    sbe_recent: int | None = None
    throttled: bool = False


MAX_FABRIC_FLAGS = 8


class GpuFabric(Struct, frozen=True, kw_only=True):
    """A GPU's multi-node NVLink fabric membership and health (NVML GPU fabric info), on
    GB200/GB300 NVL72 systems only. Added in 0.3; older peers ignore it."""

    state: ShortStr
    """``not-started``, ``in-progress`` or ``completed`` (NVML ``nvmlGpuFabricState_t``)."""
    cluster_uuid: ShortStr = ""
    """The domain's cluster UUID (``8-4-4-4-12``); empty before registration."""
    clique_id: Annotated[int, Meta(ge=0, le=2**32 - 1)] = 0
    status: int = 0
    """The registration's NVML return code (0: success)."""
    health: Annotated[list[ShortStr], Meta(max_length=MAX_FABRIC_FLAGS)] = []
    """The health mask's faults: ``degraded-bandwidth``, ``route-recovery``,
    ``route-unhealthy``, ``access-timeout-recovery``."""

    @property
    def domain(self) -> str | None:
        """``<clusterUUID>.<cliqueId>``, GPU feature discovery's ``nvidia.com/gpu.clique``
        value, once registered; None before."""
        if self.state != "completed" or not self.cluster_uuid or self.status != 0:
            return None
        return f"{self.cluster_uuid}.{self.clique_id}"


MAX_NIC_PORTS = 64
MAX_NIC_GPUS = 32
"""GPUs behind one port (half a 64-GPU node: a root complex's share at the farthest)."""
MAX_RAIL_VERDICTS = 4
DeviceName = Annotated[str, Meta(min_length=1, max_length=64)]
"""An RDMA device name (the kernel's limit, ``IB_DEVICE_NAME_MAX``, is 64)."""
Word = Annotated[str, Meta(max_length=32)]
"""A kernel enum name (``ACTIVE``, ``LinkUp``, ``InfiniBand``) or a netdev name."""
GbitRate = Annotated[float, Meta(ge=0.0, le=100_000.0)]


class NicPortInfo(Struct, frozen=True, kw_only=True, gc=False):
    """One InfiniBand or RoCE port of the node (``/sys/class/infiniband/<device>/ports/<port>``)
    and the GPUs behind it by PCIe topology: the input of the controller's network blame. Sent
    in every Snapshot, and a Snapshot goes out when what is said here changes (never for the
    counters, which move all the time: they are in the agent's /metrics). 64 ports of 8 GPUs
    each with every verdict take under 64 KiB; at every bound, under a frame's limit. Added
    in 0.4; older peers ignore it."""

    device: DeviceName
    """``mlx5_0``; ``mlx5_bond_0`` for a RoCE bond (two ports behind one netdev)."""
    port: Annotated[int, Meta(ge=0, le=255)]
    link_layer: Word = ""
    """``InfiniBand`` or ``Ethernet`` (RoCE); empty when unreadable."""
    port_state: Word = ""
    """``ACTIVE``, ``DOWN``, ``INIT``, ``ARMED``; empty when unreadable."""
    phys_state: Word = ""
    """``LinkUp``, ``Polling``, ``Disabled``, ``LinkErrorRecovery`` ...; empty when unreadable."""
    rate_gbps: GbitRate | None = None
    expected_rate_gbps: GbitRate | None = None
    """The rate it should have (a per-model setting, else the node's most common); None when
    not known."""
    netdev: Word = ""
    """The network device of a RoCE port (a bond's, ``bond0``)."""
    model: ShortStr = ""
    """The HCA type (``MT4129``: ConnectX-7)."""
    gpus: Annotated[list[Name], Meta(max_length=MAX_NIC_GPUS)] = []
    """UUIDs of the GPUs behind the port (empty: none close enough; its verdicts then reach
    no GPU)."""
    affinity: Word = ""
    """How close they are, in ``nvidia-smi topo -m``'s words: ``PIX``, ``PXB``, ``PHB``,
    ``NODE``."""
    flaps: Annotated[int, Meta(ge=0, le=2**31 - 1)] = 0
    """Link-down events within the agent's flap window (``rdma.rails.flap_window_s``)."""
    last_flap: datetime | None = None
    verdicts: Annotated[list[LabelValue], Meta(max_length=MAX_RAIL_VERDICTS)] = []
    """Codes of the port's active rail verdicts (``rail-down``, ``rail-flapping``,
    ``rail-degraded-rate``, ``rail-errors``); each GPU behind it carries the whole condition
    (scope ``rail``: severity, message naming the port, since)."""


class GpuStatus(Struct, frozen=True, kw_only=True):
    info: GpuInfo
    state: HealthState
    conditions: Annotated[list[Condition], Meta(max_length=MAX_CONDITIONS)] = []
    telemetry: GpuTelemetry | None = None
    fabric: GpuFabric | None = None
    """The GPU's NVLink fabric (multi-node NVLink systems); None elsewhere and from older
    agents."""


class Allocation(Struct, frozen=True, kw_only=True):
    """A device held by a container, from the kubelet PodResources API."""

    namespace: Name
    pod: Name
    container: Name
    gpu_uuid: Name
    device_id: Name


class AllocationUsage(Struct, frozen=True, kw_only=True):
    """Utilisation of one allocation since the previous heartbeat.

    ``attribution`` says whether NVML gave per-process figures ("process") or the whole GPU's
    figure was used ("gpu", e.g. when the GPU is shared without per-process accounting).
    """

    namespace: Name
    pod: Name
    container: Name
    gpu_uuid: Name
    utilization_ratio: Ratio
    samples: Annotated[int, Meta(ge=0)] = 1
    attribution: Literal["process", "gpu"] = "gpu"


MAX_CAPABILITIES = 16
CAPABILITIES = ("reset-gpu", "reboot", "validate", "diagnostic")
"""A Hello's ``capabilities``: ``reset-gpu`` (GPU resets), ``reboot`` (a reboot executor is
configured), ``validate`` (validation orders), ``diagnostic`` (the diagnostic hook is
installed)."""


class Hello(Struct, frozen=True, kw_only=True, tag="hello"):
    seq: Seq
    node: Name
    stream_id: Annotated[str, Meta(min_length=1, max_length=64)]
    boot_id: ShortStr
    agent_version: ShortStr
    protocol: int = PROTOCOL_VERSION
    gpus: Annotated[list[GpuInfo], Meta(max_length=MAX_GPUS)] = []
    expected_gpus: int | None = None
    capabilities: Annotated[list[ShortStr], Meta(max_length=MAX_CAPABILITIES)] | None = None
    """What the agent can execute for the remediation loop (:data:`CAPABILITIES`; an empty
    list while its remediation is off). None, from an agent older than the field: unknown,
    and the controller disrupts nothing it cannot be sure the node will carry out. Names
    this version does not know are kept, never an error."""


class Snapshot(Struct, frozen=True, kw_only=True, tag="snapshot"):
    seq: Seq
    node: Name
    taken_at: datetime
    gpus: Annotated[list[GpuStatus], Meta(max_length=MAX_GPUS)] = []
    allocations: Annotated[list[Allocation], Meta(max_length=MAX_ALLOCATIONS)] = []
    allocations_unknown: Text | None = None
    """Why the agent cannot say which pods hold its GPUs now (PodResources off, its socket
    missing, the last List failed: ``allocations`` are then the last ones it knew, or none);
    None: ``allocations`` are the kubelet's, an empty list meaning no pods. None from older
    agents."""
    node_conditions: Annotated[list[Condition], Meta(max_length=MAX_CONDITIONS)] = []
    """Verdicts about the node that belong to no GPU it can see: ``gpu-missing`` when fewer
    GPUs are visible than expected (a GPU gone from the bus before the agent started has no
    status of its own). Absent from older agents (an empty list)."""
    nics: Annotated[list[NicPortInfo], Meta(max_length=MAX_NIC_PORTS)] = []
    """The node's InfiniBand and RoCE ports, by device and port. Empty on a node without them
    and from older agents."""


class Event(Struct, frozen=True, kw_only=True, tag="event"):
    """A health transition of one GPU, or an XID that did not change its state."""

    seq: Seq
    node: Name
    at: datetime
    kind: Literal["transition", "xid"]
    gpu_uuid: Name
    gpu_index: GpuIndex
    previous: HealthState
    current: HealthState
    conditions: Annotated[list[Condition], Meta(max_length=MAX_CONDITIONS)] = []
    xid: int | None = None
    detail: Text = ""
    """With ``xid``: the driver's text of the line (XID 13 names the GPC, TPC and SM), so the
    controller can say where a job's first fault happened. Empty from older agents."""


class Heartbeat(Struct, frozen=True, kw_only=True, tag="heartbeat"):
    seq: Seq
    node: Name
    at: datetime
    usage: Annotated[list[AllocationUsage], Meta(max_length=MAX_ALLOCATIONS)] = []
    telemetry: Annotated[list[GpuTelemetry], Meta(max_length=MAX_GPUS)] = []


class ErrorCode(StrEnum):
    UNAUTHENTICATED = "unauthenticated"
    FORBIDDEN = "forbidden"
    MALFORMED = "malformed"
    TOO_LARGE = "too-large"
    OUT_OF_ORDER = "out-of-order"
    RATE_LIMITED = "rate-limited"
    UNSUPPORTED_VERSION = "unsupported-version"
    REPLACED = "replaced"
    INTERNAL = "internal"


class Ack(Struct, frozen=True, kw_only=True, tag="ack"):
    seq: Annotated[int, Meta(ge=0)]


MAX_RETRY_AFTER_S = 3600.0


class Error(Struct, frozen=True, kw_only=True, tag="error"):
    code: ErrorCode
    message: Text = ""
    retry_after_s: Annotated[float, Meta(ge=0.0, le=MAX_RETRY_AFTER_S)] | None = None
    """With ``rate-limited`` (the controller is pacing admissions): come back no sooner than
    this many seconds (the agent adds jitter on top). An agent older than the field ignores it
    (msgspec skips unknown fields) and backs off as after any refusal."""


NODE_HEADER = "Gpuhealth-Node"
"""Header of the agent's upgrade request naming its node: before the upgrade (and before any
review) the controller may answer "come back later" with HTTP 503 and ``Retry-After``, and
notes that node as waiting because of it. A claim only, like Hello's ``node`` before review."""


def retry_after_header(seconds: float) -> str:
    """``Retry-After`` in whole seconds (RFC 9110 delta-seconds), rounded up: never sooner."""
    return str(max(0, math.ceil(min(seconds, MAX_RETRY_AFTER_S))))


def retry_after_from_header(value: str | None) -> float | None:
    """The delay of a ``Retry-After`` in delta-seconds; None for an absent, malformed or
    HTTP-date value (the agent then backs off as after any refused connection)."""
    if value is None:
        return None
    value = value.strip()
    if not value.isascii() or not value.isdigit() or len(value) > 10:
        return None
    return min(float(int(value)), MAX_RETRY_AFTER_S)


AgentMessage = Hello | Snapshot | Event | Heartbeat
ControllerMessage = Ack | Error
Message = Hello | Snapshot | Event | Heartbeat | Ack | Error
