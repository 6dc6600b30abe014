"""Hand-built engine state for the agent's state, metrics and status tests."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from gpuhealth.agent.counters import Counters
from gpuhealth.agent.engine_driver import EngineDriver
from gpuhealth.agent.health import HealthEngine, HealthSettings
from gpuhealth.agent.health.rails import RailGpu, RailStatus
from gpuhealth.agent.node_snapshot import NodeSnapshotCache
from gpuhealth.agent.observations import (
    GpuIdentity,
    GpuInstanceSample,
    GpuSample,
    Inventory,
    NicPortSample,
    PciAddress,
)
from gpuhealth.agent.podresources.refresher import PodResourcesRefresher
from gpuhealth.agent.podresources.settings import PodResourcesSettings
from gpuhealth.agent.sources.base import SourceStatus
from gpuhealth.agent.sources.dcgm.settings import DcgmSettings
from gpuhealth.agent.sources.dcgm.source import DcgmExporterSource
from gpuhealth.agent.sources.kmsg.settings import KmsgSettings
from gpuhealth.agent.sources.kmsg.source import KmsgSource
from gpuhealth.agent.sources.nvml.settings import NvmlSettings
from gpuhealth.agent.sources.nvml.source import NvmlSource
from gpuhealth.agent.sources.rdma.settings import RdmaSettings
from gpuhealth.agent.sources.rdma.source import RdmaSource
from gpuhealth.agent.sources.sim.scenario import Scenario
from gpuhealth.agent.sources.sim.source import SimSource
from gpuhealth.agent.state_store import LatchedStore
from gpuhealth.agent.usage import UsageAccumulator
from gpuhealth.protocol import Allocation, Condition, GpuInfo, GpuStatus
from tests.support.clock import FakeClock

AT = datetime(2026, 11, 22, 10, 0, 0, tzinfo=UTC)
MODEL = "NVIDIA H100 80GB HBM3"


def uuid(i: int) -> str:
    return f"GPU-{i:08x}-1111-2222-3333-444455556666"


def identity(i: int) -> GpuIdentity:
    return GpuIdentity(
        index=i, uuid=uuid(i), model=MODEL, pci_bus_id=f"00000000:{0x18 + i:02X}:00.0"
    )


def full_sample(i: int) -> GpuSample:
    """A sample with every field set, so that every per-GPU family has a series."""
    return GpuSample(
        uuid=uuid(i),
        at=AT,
        temperature_c=40.0 + i,
        memory_temperature_c=45.0,
        slowdown_temperature_c=87.0,
        shutdown_temperature_c=92.0,
        power_w=300.5,
        power_limit_w=700.0,
        utilization_ratio=0.75,
        memory_utilization_ratio=0.5,
        memory_used_bytes=10 * 2**30,
        memory_total_bytes=80 * 2**30,
        sm_clock_hz=1.98e9,
        memory_clock_hz=2.6e9,
        throttle_reasons=frozenset({"power_cap", "vendor_new"}),
        ecc_sbe_volatile=3,
        ecc_dbe_volatile=0,
        ecc_sbe_aggregate=10,
        ecc_dbe_aggregate=1,
        retired_pages_sbe=2,
        retired_pages_dbe=1,
        retired_pages_pending=False,
        remapped_rows_correctable=4,
        remapped_rows_uncorrectable=0,
        row_remap_pending=False,
        row_remap_failure=False,
        pcie_replay_count=7,
        nvlink_links_up=18,
        nvlink_links_total=18,
        nvlink_errors=5,
        fan_speed_ratio=0.3,
        performance_state=0,
        recovery_action=0,
        reset_required=False,
        gpu_instances=(
            GpuInstanceSample(
                instance_id=1,
                profile="3g.40gb",
                memory_used_bytes=2**30,
                memory_total_bytes=40 * 2**30,
                utilization_ratio=0.25,
            ),
        ),
    )


def status(i: int, state: str = "healthy", conditions: tuple[Condition, ...] = ()) -> GpuStatus:
    ident = identity(i)
    return GpuStatus(
        info=GpuInfo(index=i, uuid=ident.uuid, pci_bus_id=ident.pci_bus_id, model=MODEL),
        state=state,  # type: ignore[arg-type]
        conditions=list(conditions),
    )


XID79 = Condition(
    reason="XidError",
    code="xid-79",
    severity="unhealthy",
    message="GPU has fallen off the bus",
    action="RESTART_BM",
    xid=79,
    since=AT,
)


RAIL_FLAPPING = Condition(
    reason="RailFlapping",
    code="rail-flapping",
    severity="degraded",
    action="CHECK_NETWORK",
    message="mlx5_0 port 1 (InfiniBand) went down 2 times within 600 s",
    since=AT,
    scope="rail",
)


def gpu_address(i: int) -> PciAddress:
    """GPU ``i``'s PCI address (:func:`identity`'s)."""
    a = PciAddress.parse(identity(i).pci_bus_id)
    assert a is not None
    return a


def port_up(gpus: tuple[int, ...] = (0, 1), **fields: object) -> NicPortSample:
    """A ConnectX-7 InfiniBand port, ACTIVE and LinkUp at 400 Gb/s, behind GPUs ``gpus`` (one
    PCIe switch), its counters quiet; ``fields`` replace any of that."""
    port = NicPortSample(
        device="mlx5_0",
        port=1,
        link_layer="InfiniBand",
        port_state="ACTIVE",
        phys_state="LinkUp",
        rate_gbps=400.0,
        counters={"link_downed": 0, "symbol_error": 0, "port_rcv_errors": 0},
        model="MT4129",
        gpus=tuple(gpu_address(i) for i in gpus),
        affinity="PIX",
    )
    return replace(port, **fields)  # type: ignore[arg-type]


def rail(gpus: tuple[int, ...] = (0, 1), *, flapping: bool = True) -> RailStatus:
    """A ConnectX-7 InfiniBand port behind GPUs ``gpus``, that flapped twice (its
    ``link_downed`` stopped at 255)."""
    return RailStatus(
        sample=port_up(
            gpus,
            counters={"link_downed": 255, "symbol_error": 17},
            saturated=frozenset({"link_downed"}),
            netdev="ib0",
        ),
        expected_rate_gbps=400.0,
        flaps=2,
        flaps_total=5,
        last_flap=AT,
        verdicts=(RAIL_FLAPPING,) if flapping else (),
        gpus=tuple(RailGpu(i, uuid(i)) for i in gpus),
    )


def alloc(i: int, pod: str, device_id: str | None = None) -> Allocation:
    return Allocation(
        namespace="ml",
        pod=pod,
        container="main",
        gpu_uuid=uuid(i),
        device_id=device_id or uuid(i),
    )


@dataclass
class FakeEngine:
    """The read side of the health engine, with fixed contents."""

    stat: list[GpuStatus] = field(default_factory=list)
    xids: dict[tuple[str, int], int] = field(default_factory=dict)
    samples: dict[str, GpuSample] = field(default_factory=dict)
    inv: Inventory | None = None
    calls: int = 0
    node: list[Condition] = field(default_factory=list)
    missing: int = 0
    ops: dict[tuple[str, str, int, str, str], int] = field(default_factory=dict)
    """(uuid, module, code, category, handled) -> GPU Operational Events seen."""
    nics: list[RailStatus] = field(default_factory=list)

    def nic_ports(self) -> list[RailStatus]:
        return list(self.nics)

    def op_event_counts(self) -> dict[tuple[str, str, int, str, str], int]:
        return dict(self.ops)

    def statuses(self) -> list[GpuStatus]:
        self.calls += 1
        return list(self.stat)

    def xid_action_counts(self) -> dict[tuple[str, int, str], int]:
        return {(u, x, xid_action(x)): n for (u, x), n in self.xids.items()}

    def latest_samples(self) -> dict[str, GpuSample]:
        return dict(self.samples)

    def inventory(self) -> Inventory | None:
        return self.inv

    def node_conditions(self) -> list[Condition]:
        return list(self.node)

    def gpus_missing(self) -> int:
        return self.missing


def engine_with(n: int, *, samples: bool = True) -> FakeEngine:
    return FakeEngine(
        stat=[status(i) for i in range(n)],
        samples={uuid(i): full_sample(i) for i in range(n)} if samples else {},
        inv=Inventory(
            source="sim",
            gpus=tuple(identity(i) for i in range(n)),
            driver_version="580.95.05",
            cuda_version="13.0",
        ),
    )


def xid_action(xid: int) -> str:
    return {79: "RESTART_BM", 13: "IGNORE"}.get(xid, "UNKNOWN")


class Tasks:
    """A supervisor's ``status()`` as the agent's report reads it."""

    def __init__(self, status: dict[str, dict[str, object]]) -> None:
        self._status = status

    def status(self) -> dict[str, dict[str, object]]:
        return self._status


@dataclass
class EveryPart:
    """One of each part of the agent that keeps counters (no I/O started)."""

    nvml: NvmlSource
    kmsg: KmsgSource
    dcgm: DcgmExporterSource
    sim: SimSource
    rdma: RdmaSource
    pods: PodResourcesRefresher
    engine: HealthEngine
    driver: EngineDriver

    def sources(self) -> list[SourceStatus]:
        return [self.nvml, self.kmsg, self.dcgm, self.sim, self.rdma, self.pods]

    def all_counters(self) -> list[Counters]:
        return [s.counters for s in self.sources()] + [self.engine.counters, self.driver.counters]

    def other_counters(self) -> list[Counters]:
        """Counters of the parts not in the ``_full_stats`` sources (sim, kmsg, dcgm)."""
        return [
            self.nvml.counters,
            self.rdma.counters,
            self.pods.counters,
            self.engine.counters,
            self.driver.counters,
        ]


def every_part(tmp_dir: str | None = None) -> EveryPart:
    """``tmp_dir``: the state dir (None: a new temporary one)."""
    clock = FakeClock()
    engine = HealthEngine(HealthSettings(), clock)
    state = NodeSnapshotCache("n", engine, clock)
    return EveryPart(
        nvml=NvmlSource(NvmlSettings(), clock, nvml_module=object()),
        kmsg=KmsgSource("/dev/null", KmsgSettings(), clock),
        dcgm=DcgmExporterSource("http://127.0.0.1:9/metrics", DcgmSettings(), clock),
        sim=SimSource(Scenario(gpus=1), clock, seed=0),
        rdma=RdmaSource(RdmaSettings(sysfs_root="/nonexistent"), clock),
        pods=PodResourcesRefresher(PodResourcesSettings(), clock, lambda _: None),
        engine=engine,
        driver=EngineDriver(
            engine,
            state,
            LatchedStore(tmp_dir or tempfile.mkdtemp(prefix="gpuhealth-state-"), "b"),
            UsageAccumulator(),
        ),
    )
