"""What sources observe, as plain immutable data.

Sources (:mod:`gpuhealth.agent.sources`) turn the outside world (NVML, /dev/kmsg, a
dcgm-exporter scrape, a scenario) into these observations and hand them to an
:data:`ObservationSink`; the health engine (:mod:`gpuhealth.agent.health.engine`) turns
observations into per-GPU states. Every optional field is
``None`` when the device does not report it (NVML NOT_SUPPORTED): absent, not an error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

SourceName = Literal["nvml", "kmsg", "dcgm", "sim", "rdma"]


@dataclass(frozen=True, slots=True, order=True)
class PciAddress:
    """A PCI bus address in its one canonical form, ``0000:1b:00.0`` (:meth:`__str__`).

    NVML writes ``00000000:1B:00.0``, the kernel ``0000:1b:00``, dcgm-exporter either:
    :meth:`parse` reads every such spelling, so two addresses compare equal exactly when they
    name the same function. The health engine maps an address to its GPU
    (:meth:`~gpuhealth.agent.health.engine.HealthEngine.observe`); nothing else does."""

    domain: int
    bus: int
    device: int
    function: int

    @classmethod
    def parse(cls, text: str) -> PciAddress | None:
        """``0000:1b:00``, ``00000000:1B:00.0``, ``1b:00.0`` -> the address; None when the text
        is no PCI address."""
        parts = text.strip().lower().split(":")
        if len(parts) == 2:
            parts = ["0", *parts]
        if len(parts) != 3 or not all(parts):
            return None
        domain, bus, devfn = parts
        dev, _, fn = devfn.partition(".")
        try:
            fields = (int(domain, 16), int(bus, 16), int(dev, 16), int(fn or "0", 16))
        except ValueError:
            return None
        limits = (0xFFFFFFFF, 0xFF, 0xFF, 0xF)  # as wide as the spellings (logs bend the rest)
        if any(v < 0 or v > hi for v, hi in zip(fields, limits, strict=True)):
            return None
        return cls(*fields)

    def __str__(self) -> str:
        return f"{self.domain:04x}:{self.bus:02x}:{self.device:02x}.{self.function:x}"


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    index: int
    uuid: str
    model: str
    pci_bus_id: str
    """As the source reports it (NVML: ``00000000:1B:00.0``); compared only through
    :meth:`PciAddress.parse`."""
    serial: str | None = None
    memory_total_bytes: int | None = None
    mig_enabled: bool = False
    minor_number: int | None = None
    """``/dev/nvidia<minor>``: the NVIDIA DRA driver names a GPU ``gpu-<minor>``, which need
    not be its NVML index."""


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG device (GPU instance + compute instance) of a GPU in MIG mode, one poll's read.

    NVML answers memory info and the processes on a MIG device handle, not utilisation rates
    (NOT_SUPPORTED on MIG handles). ``utilization_ratio`` is therefore 0.0 when no process runs
    on the instance (nothing can be using it) and ``None`` otherwise (unknown, never idle).
    """

    uuid: str
    """``MIG-<uuid>``, as the device plugin names it."""
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    profile_id: int | None = None
    """The GPU instance profile (the DRA driver's ``gpu-<minor>-mig-<profile>-<start>-<size>``)."""
    placement_start: int | None = None
    placement_size: int | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    processes: int | None = None
    """Compute processes on the instance."""
    utilization_ratio: float | None = None


@dataclass(frozen=True, slots=True)
class Inventory:
    """The GPUs a source found, with node-level versions. Sent at start and when it changes."""

    source: SourceName
    gpus: tuple[GpuIdentity, ...]
    driver_version: str | None = None
    cuda_version: str | None = None


@dataclass(frozen=True, slots=True)
class GpuInstanceSample:
    """One MIG GPU instance of a GPU, where the source reports per instance (dcgm-exporter's
    ``GPU_I_ID`` / ``GPU_I_PROFILE`` series)."""

    instance_id: int
    profile: str
    """MIG profile name, e.g. ``3g.40gb`` (empty when not reported)."""
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    utilization_ratio: float | None = None
    """Graphics-engine activity of the instance, 0..1."""


FabricState = Literal["not-supported", "not-started", "in-progress", "completed"]
"""NVML's GPU fabric state (``nvmlGpuFabricState_t``): the GPU's registration with the
multi-node NVLink fabric (GB200/GB300 NVL72); ``not-supported`` on every other system."""

FABRIC_HEALTH_FLAGS = (
    "degraded-bandwidth",
    "route-recovery",
    "route-unhealthy",
    "access-timeout-recovery",
)
"""The faults NVML's fabric health mask can flag (``FabricInfo.health``; the simulator's
``fabric_health`` takes the same names)."""
"""What a GPU's fabric health mask can say is wrong (the mask's TRUE values)."""


@dataclass(frozen=True, slots=True)
class FabricInfo:
    """One GPU's multi-node NVLink fabric membership and health (NVML GPU fabric info)."""

    state: FabricState
    cluster_uuid: str = ""
    """The NVLink domain's cluster UUID, ``8-4-4-4-12`` lower-case hex (GPU feature
    discovery's form); empty until the GPU is registered."""
    clique_id: int = 0
    status: int = 0
    """The registration's result (an NVML return code: 0 = success)."""
    health: frozenset[str] = frozenset()
    """The health mask's TRUE flags among :data:`FABRIC_HEALTH_FLAGS`."""

    @property
    def domain(self) -> str | None:
        """``<clusterUUID>.<cliqueId>`` (GPU feature discovery's ``nvidia.com/gpu.clique``)
        once the GPU is registered; None before, and off multi-node NVLink systems."""
        if self.state != "completed" or not self.cluster_uuid or self.status != 0:
            return None
        return f"{self.cluster_uuid}.{self.clique_id}"


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One poll of one GPU. Counters are cumulative as the device reports them."""

    uuid: str
    at: datetime
    temperature_c: float | None = None
    memory_temperature_c: float | None = None
    slowdown_temperature_c: float | None = None
    shutdown_temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    utilization_ratio: float | None = None
    memory_utilization_ratio: float | None = None
    """Memory-bandwidth utilisation (NVML ``memory`` utilisation rate), 0..1."""
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    sm_clock_hz: float | None = None
    memory_clock_hz: float | None = None
    throttle_reasons: frozenset[str] | None = None
    """Active reasons among ``hw_thermal``, ``sw_thermal``, ``hw_slowdown``, ``power_cap``,
    ``hw_power_brake``, ``sync_boost``, ``idle``, ``applications_clocks``."""
    ecc_sbe_volatile: int | None = None
    ecc_dbe_volatile: int | None = None
    ecc_sbe_aggregate: int | None = None
    ecc_dbe_aggregate: int | None = None
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    row_remap_pending: bool | None = None
    row_remap_failure: bool | None = None
    pcie_replay_count: int | None = None
    nvlink_links_up: int | None = None
    nvlink_links_total: int | None = None
    nvlink_errors: int | None = None
    """Sum of NVLink replay, recovery and CRC error counters over all links."""
    fan_speed_ratio: float | None = None
    performance_state: int | None = None
    mig_mode: bool | None = None
    mig_instances: int | None = None
    mig_devices: tuple[MigDevice, ...] | None = None
    """The MIG devices in MIG mode (empty without instances); ``None`` when not read."""
    process_utilization: Mapping[int, float] = field(default_factory=dict)
    """PID -> SM utilisation ratio, when NVML reports per-process figures."""
    recovery_action: int | None = None
    """The driver's GPU recovery action (NVML ``nvmlDeviceGpuRecoveryAction_t``: 0 none,
    1 GPU reset, 2 node reboot ...; :mod:`gpuhealth.agent.health.recovery_action`)."""
    reset_required: bool | None = None
    """An NVML call of this poll answered NVML_ERROR_RESET_REQUIRED."""
    gpu_instances: tuple[GpuInstanceSample, ...] = ()
    """Per MIG GPU instance figures, where the source has them (dcgm-exporter)."""
    fabric: FabricInfo | None = None
    """The GPU's NVLink fabric membership and health; ``None`` when not read or NOT_SUPPORTED
    (fabric state ``not-supported`` is reported as ``None`` too: no fabric to judge)."""


@dataclass(frozen=True, slots=True)
class XidObservation:
    """An XID from NVML's event set, a kernel-log line, DCGM or the simulator.

    Kernel-log XIDs carry only the PCI address (``uuid`` None): the health engine maps it to
    its GPU, holding the XID while no GPU inventory is known yet. On a MIG GPU ``uuid`` is the
    parent GPU's and the instance ids say which slice it hit.
    """

    source: SourceName
    xid: int
    at: datetime
    uuid: str | None = None
    pci: PciAddress | None = None
    pid: int | None = None
    process_name: str | None = None
    message: str = ""
    gpu_instance: int | None = None
    """MIG GPU instance id the driver attributed the XID to (kernel log ``GPU-I:``)."""
    compute_instance: int | None = None
    """MIG compute instance id within that GPU instance (kernel log ``GPU-CI:``)."""
    redelivered: bool = False
    """Read again after a restart: the run that handed this line on may have been stopped
    before saving its position (the engine drops it when its verdict is already latched)."""
    on_taken: Callable[[], object] | None = field(default=None, compare=False, repr=False)
    """Called (on the event loop, by the engine driver) once the engine has taken this XID:
    applied it, or dropped it for good. The kernel-log follower saves its position past the
    line then, and not before."""


@dataclass(frozen=True, slots=True)
class OperationalEventObservation:
    """A GPU Operational Event: the driver's structured record of a condition (R615+, preview;
    :mod:`gpuhealth.agent.health.op_event_catalog`), from NVML's event set, a CPER record read
    back after a restart, or the simulator. Numbers as the driver sends them."""

    source: SourceName
    at: datetime
    uuid: str | None
    module: str
    """Module signature, ``GPU-RAS``."""
    code: int
    """Module event code."""
    category: int
    severity: int
    """``nvmlOperationalEventSeverity_t`` (10 informational ... 40 fatal)."""
    scope: int = 0
    attributes: int = 0
    group_attributes: int = 0
    legacy_xid: int | None = None
    group_cursor: int = 0
    """The event group's cursor (= the CPER record id of the group)."""
    log_level: int = 0
    via: Literal["events", "cper"] = "events"
    """``cper``: read back from the GPU's CPER log (what happened while the agent was down)."""
    group_last: bool = True
    """False: a live event with more of its group to come (NVML's ``groupIndex`` below
    ``groupSize - 1``): the group's record id is remembered only with its last event, so an agent
    stopped in between reads the rest back instead of losing it."""
    decoded: bool = True
    """False: a CPER record whose NVIDIA event sections could not be decoded, reported as one
    event of module ``CPER`` standing for its whole event group."""


@dataclass(frozen=True, slots=True)
class SxidObservation:
    """An NVSwitch error (``SXid``) from the kernel log of an HGX system: it belongs to a
    switch, not to a GPU (every GPU's NVLink traffic crosses the node's switches)."""

    source: SourceName
    sxid: int
    at: datetime
    fatal: bool
    switch: int | None = None
    """``nvidia-nvswitch<N>``."""
    pci: PciAddress | None = None
    """The switch's PCI address (a switch's, never mapped to a GPU)."""
    link: int | None = None
    message: str = ""
    redelivered: bool = False


@dataclass(frozen=True, slots=True)
class LivenessObservation:
    """``lost``: NVML says GPU_IS_LOST. ``unresponsive``: a call passed its deadline.
    ``missing``: fewer GPUs than expected. ``responsive``: calls work again."""

    source: SourceName
    kind: Literal["lost", "unresponsive", "missing", "responsive"]
    at: datetime
    uuid: str | None = None
    detail: str = ""
    expected: int | None = None
    """Node-level ``missing`` / ``responsive`` (no ``uuid``): GPUs the node should have."""
    visible: int | None = None
    """Node-level ``missing`` / ``responsive``: GPUs the source can see."""


@dataclass(frozen=True, slots=True)
class EccObservation:
    """An ECC error notified by NVML's event set (between polls)."""

    source: SourceName
    uuid: str
    at: datetime
    double_bit: bool


@dataclass(frozen=True, slots=True)
class RecoveryActionObservation:
    """NVML's event that the GPU's recovery action changed, with the value read then."""

    source: SourceName
    uuid: str
    at: datetime
    value: int
    """``nvmlDeviceGpuRecoveryAction_t`` (0: none)."""


NIC_PORT_UP = ("ACTIVE", "LinkUp")
"""An RDMA port's logical and physical state when it carries traffic (the kernel's names)."""


@dataclass(frozen=True, slots=True)
class NicPortSample:
    """One poll of one InfiniBand or RoCE port (``/sys/class/infiniband/<device>/ports/<port>``).

    A value the poll could not read is ``None`` (or absent from ``counters``): not judged,
    never taken for a fault."""

    device: str
    """The RDMA device, ``mlx5_0`` (``mlx5_bond_0`` for a RoCE bond)."""
    port: int
    link_layer: str = ""
    """``InfiniBand`` or ``Ethernet`` (RoCE); empty when unreadable."""
    port_state: str | None = None
    """The logical port state: ``DOWN``, ``INIT``, ``ARMED``, ``ACTIVE``, ``ACTIVE_DEFER``."""
    phys_state: str | None = None
    """The physical port state: ``Sleep``, ``Polling``, ``Disabled``, ``LinkUp``,
    ``LinkErrorRecovery`` ..."""
    rate_gbps: float | None = None
    """The negotiated rate (``400 Gb/sec (4X NDR)``: 400.0)."""
    counters: Mapping[str, int] = field(default_factory=dict)
    """Counter name (``counters/`` and ``hw_counters/`` file names) -> cumulative value, for
    those the port serves."""
    saturated: frozenset[str] = frozenset()
    """Counters stuck at their width's maximum (the InfiniBand port counters stop there, they
    do not wrap): their growth cannot be seen until someone resets them."""
    model: str = ""
    """The HCA type (``hca_type``: ``MT4123`` ConnectX-6, ``MT4129`` ConnectX-7)."""
    netdev: str = ""
    """The network device of a RoCE port (the bond's, ``bond0``, for a bonded pair)."""
    gpus: tuple[PciAddress, ...] = ()
    """The GPUs behind the NIC by PCIe topology (the health engine maps them to GPUs)."""
    affinity: str = ""
    """How close they are, in ``nvidia-smi topo -m``'s words: ``PIX`` (one PCIe switch),
    ``PXB`` (several switches), ``PHB`` (the same root complex), ``NODE`` (the same NUMA
    node); empty without GPUs."""

    @property
    def up(self) -> bool | None:
        """ACTIVE and LinkUp; None when either state could not be read."""
        if self.port_state is None or self.phys_state is None:
            return None
        return (self.port_state, self.phys_state) == NIC_PORT_UP


@dataclass(frozen=True, slots=True)
class NicObservation:
    """Every InfiniBand and RoCE port of the node at one poll.

    A port of ``source`` that is absent, and whose device is not in ``unread``, is gone (the NIC
    was hot-removed): its verdicts go with it, none is raised from missing data."""

    source: SourceName
    at: datetime
    ports: tuple[NicPortSample, ...]
    unread: frozenset[str] = frozenset()
    """Devices this poll could not read (their read passed its deadline): their ports keep what
    was known, nothing about them is judged."""


@dataclass(frozen=True, slots=True)
class ResetObservation:
    """The GPU was reset or the node rebooted: XID/ECC verdicts may clear."""

    source: SourceName
    at: datetime
    uuid: str | None = None
    reason: str = "reset"


Observation = (
    Inventory
    | GpuSample
    | XidObservation
    | OperationalEventObservation
    | SxidObservation
    | LivenessObservation
    | EccObservation
    | RecoveryActionObservation
    | ResetObservation
    | NicObservation
)
ObservationSink = Callable[[Observation], object]
