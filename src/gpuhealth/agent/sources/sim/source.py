"""Simulated GPUs: realistic H100 telemetry with injected faults from a scenario; and the
InfiniBand/RoCE NICs beside them where the scenario has ``nics:`` (:class:`_SimNic`).

Deterministic for a given seed. The demo, the tests and the benchmarks use it in place of
NVML: :meth:`SimSource.step` is one poll (synchronous, so benchmarks can time it), and
:meth:`SimSource.run` drives it on the injected clock.
"""

from __future__ import annotations

import random
import time
import uuid as uuidlib
from datetime import datetime

from gpuhealth.agent.counters import Counters, CounterSpec, Histogram
from gpuhealth.agent.observations import (
    EccObservation,
    FabricInfo,
    GpuIdentity,
    GpuSample,
    Inventory,
    LivenessObservation,
    NicObservation,
    NicPortSample,
    ObservationSink,
    PciAddress,
    ResetObservation,
    SourceName,
    SxidObservation,
    XidObservation,
)
from gpuhealth.agent.sources.sim.op_events import observation as op_observation
from gpuhealth.agent.sources.sim.scenario import RAIL_KINDS, Scenario, ScenarioFault, ScenarioNic
from gpuhealth.common.clock import Clock

H100_MEMORY_BYTES = 80 * 1024**3
H100_POWER_LIMIT_W = 700.0
H100_SLOWDOWN_C = 89.0
H100_SHUTDOWN_C = 92.0
NVLINKS = 18
_NO_REASONS: frozenset[str] = frozenset()


class _SimGpu:
    """One simulated GPU's persistent state."""

    __slots__ = (
        "dbe",
        "dbe_agg",
        "down_until",
        "fabric_health",
        "fabric_health_until",
        "fabric_state",
        "fabric_state_until",
        "hang_until",
        "identity",
        "index",
        "lost",
        "missing",
        "nvlink_down",
        "nvlink_errors",
        "pcie",
        "pids",
        "pids_until",
        "remap_failure",
        "remap_pending",
        "retired_pending",
        "sbe",
        "sbe_agg",
        "temp_until",
        "temp_value",
        "throttle",
        "throttle_until",
        "util",
        "util_until",
        "util_value",
        "uuid",
    )

    def __init__(self, index: int, model: str, rng: random.Random) -> None:
        self.index = index
        self.uuid = "GPU-" + str(uuidlib.UUID(int=rng.getrandbits(128), version=4))
        domain, slot = divmod(index, 13)  # 13 distinct buses per PCI domain
        bus = 0x18 + 0x11 * slot
        self.identity = GpuIdentity(
            index=index,
            uuid=self.uuid,
            model=model,
            pci_bus_id=f"{domain:08X}:{bus:02X}:00.0",
            serial=f"165322{rng.randrange(10**7):07d}",
            memory_total_bytes=H100_MEMORY_BYTES,
        )
        self.util = rng.uniform(0.55, 0.95)
        self.sbe = self.dbe = self.pcie = self.nvlink_errors = 0
        self.sbe_agg = rng.randrange(0, 5)
        self.dbe_agg = 0
        self.remap_pending = self.remap_failure = self.retired_pending = False
        self.lost = self.missing = False
        self.hang_until = self.temp_until = self.throttle_until = self.util_until = 0.0
        self.down_until = 0.0
        self.temp_value = 0.0
        self.util_value = 0.0
        self.nvlink_down = 0
        self.throttle: frozenset[str] = _NO_REASONS
        self.pids: tuple[int, ...] = ()
        self.pids_until = 0.0
        self.fabric_state = "completed"
        self.fabric_state_until = 0.0
        self.fabric_health: frozenset[str] = _NO_REASONS
        self.fabric_health_until = 0.0

    def hung(self, t: float) -> bool:
        return self.hang_until > t


class _SimNic:
    """One simulated NIC's port between polls: its link, rate and counters."""

    __slots__ = ("down_until", "errors_per_s", "errors_until", "flaps", "gpus", "last_t",
                 "link_downed", "nic", "rate", "rate_until", "symbol_error")  # fmt: skip

    def __init__(self, nic: ScenarioNic, gpus: tuple[PciAddress, ...]) -> None:
        self.nic = nic
        self.gpus = gpus
        self.down_until = self.rate_until = self.errors_until = 0.0
        self.rate = nic.rate_gbps
        self.errors_per_s = 0.0
        self.flaps: list[float] = []
        """Times of link-down events still to come (``rail_flap``)."""
        self.link_downed = 0
        self.symbol_error = 0.0
        self.last_t: float | None = None

    def fire(self, ev: ScenarioFault, t: float, until: float) -> None:
        if ev.kind == "rail_down":
            self.down_until = until
            self.link_downed += 1
        elif ev.kind == "rail_flap":
            n = int(ev.value) if isinstance(ev.value, int | float) else 0
            span = until - t if until != float("inf") else 0.0
            self.flaps += [t + span * i / n for i in range(n)]
        elif ev.kind == "rail_rate":
            self.rate = float(ev.value) if isinstance(ev.value, int | float) else self.rate
            self.rate_until = until
        else:  # rail_errors
            self.errors_per_s = float(ev.value) if isinstance(ev.value, int | float) else 0.0
            self.errors_until = until

    def sample(self, t: float) -> NicPortSample:
        """The port at ``t``: a flap due is one link-down event, seen down by this poll."""
        flapped = [f for f in self.flaps if f <= t]
        self.flaps = [f for f in self.flaps if f > t]
        self.link_downed += len(flapped)
        if self.last_t is not None and self.errors_until > self.last_t:
            self.symbol_error += self.errors_per_s * (min(t, self.errors_until) - self.last_t)
        self.last_t = t
        down = bool(flapped) or self.down_until > t
        nic = self.nic
        return NicPortSample(
            device=nic.device,
            port=1,
            link_layer=nic.link_layer,
            port_state="DOWN" if down else "ACTIVE",
            phys_state="Polling" if down else "LinkUp",
            rate_gbps=self.rate if self.rate_until > t else nic.rate_gbps,
            counters={
                "link_downed": self.link_downed % 256,
                "symbol_error": int(self.symbol_error) % 65536,
                "port_rcv_errors": 0,
                "link_error_recovery": 0,
            },
            model=nic.model,
            netdev="" if nic.link_layer == "InfiniBand" else f"{nic.device}-net",
            gpus=self.gpus,
            affinity="PIX",
        )


SIM_FAULTS = CounterSpec("sim_faults", "Scenario faults the simulator injected.")


class SimSource:
    """A :class:`~gpuhealth.agent.sources.base.Source` that plays a scenario on simulated GPUs."""

    name: SourceName = "sim"

    def __init__(
        self, scenario: Scenario, clock: Clock, seed: int, *, resume_at_s: float = 0.0
    ) -> None:
        """``resume_at_s``: the node rebooted (simulated, ``sim/reboot.py``) this far into the
        scenario; it goes on from there with the GPUs as the reboot left them."""
        self.scenario = scenario
        self._resume_at_s = resume_at_s
        self._clock = clock
        self._rng = random.Random(seed if scenario.seed is None else scenario.seed)
        self._gpus = [_SimGpu(i, scenario.model, self._rng) for i in range(scenario.gpus)]
        self._nics = {
            n.device: _SimNic(
                n,
                tuple(
                    a for i in n.gpus if (a := PciAddress.parse(self._gpus[i].identity.pci_bus_id))
                ),
            )
            for n in scenario.nics
        }
        self._next_fault = 0
        self.counters = Counters(SIM_FAULTS)
        self.polls = Histogram()
        self.errors = 0
        self.up = True
        self.ready = True
        self.last_poll_duration_s = 0.0
        self._t0: float | None = None

    def _addresses(self, gpus: tuple[int, ...]) -> tuple[PciAddress, ...]:
        """The PCI addresses of the GPUs at these indexes."""
        found = (PciAddress.parse(self._gpus[i].identity.pci_bus_id) for i in gpus)
        return tuple(a for a in found if a is not None)

    def elapsed(self) -> float:
        """Seconds into the scenario (0 before it started)."""
        return 0.0 if self._t0 is None else self._clock.monotonic() - self._t0

    def gpu_state(self, uuid: str) -> _SimGpu | None:
        """A GPU NVML would know (not gone from the bus)."""
        return next((g for g in self._gpus if g.uuid == uuid and not g.missing), None)

    def processes(self, uuid: str) -> tuple[int, ...]:
        """PIDs running on the GPU (a scenario's ``processes`` fault, for its duration)."""
        g = self.gpu_state(uuid)
        return g.pids if g is not None and g.pids_until > self.elapsed() else ()

    def reset_gpu(self, uuid: str) -> bool:
        """A GPU reset (``nvidia-smi --gpu-reset``): what a reset clears is gone. False for a
        GPU the simulator does not have."""
        g = next((g for g in self._gpus if g.uuid == uuid), None)
        if g is None:
            return False
        self._reset(g)
        return True

    def inventory(self) -> Inventory:
        return Inventory(
            source="sim",
            gpus=tuple(g.identity for g in self._gpus if not g.missing),
            driver_version="570.133.20",
            cuda_version="12.8",
        )

    async def run(self, sink: ObservationSink) -> None:
        if self._resume_at_s > 0:
            self._replay_until(self._resume_at_s)
        if self.scenario.inventory_delay_s > 0:
            await self._clock.sleep(self.scenario.inventory_delay_s)
        sink(self.inventory())
        t0 = self._t0 = self._clock.monotonic() - self._resume_at_s
        interval = self.scenario.poll_interval_s
        end = self.scenario.duration_s
        while True:
            t = self._clock.monotonic() - t0
            started = time.perf_counter()
            self.step(t, sink)
            self.last_poll_duration_s = time.perf_counter() - started
            self.polls.observe(self.last_poll_duration_s)
            if end is not None and t >= end:
                return
            await self._clock.sleep(interval)

    def step(self, t: float, sink: ObservationSink) -> None:
        """One poll at ``t`` seconds into the scenario: inject due faults, emit samples."""
        faults = self.scenario.faults
        now = self._clock.now()
        while self._next_fault < len(faults) and faults[self._next_fault].at_s <= t:
            self._inject(faults[self._next_fault], t, now, sink)
            self._next_fault += 1
        for g in self._gpus:
            if g.missing or g.lost:
                continue
            if g.hang_until > t:
                sink(
                    LivenessObservation(
                        source="sim",
                        kind="unresponsive",
                        at=now,
                        uuid=g.uuid,
                        detail="simulated NVML call timed out",
                    )
                )
                continue
            sink(self._sample(g, t, now))
        if self._nics:
            ports = tuple(nic.sample(t) for nic in self._nics.values())
            sink(NicObservation(source="sim", at=now, ports=ports))

    def _replay_until(self, at_s: float) -> None:
        """After a simulated reboot: play the faults before ``at_s`` silently (nothing is
        observed, nothing counted), then reboot every GPU."""
        faults = self.scenario.faults
        now = self._clock.now()
        while self._next_fault < len(faults) and faults[self._next_fault].at_s <= at_s:
            ev = faults[self._next_fault]
            self._inject(ev, ev.at_s, now, _discard, count=False)
            self._next_fault += 1
        for g in self._gpus:
            self._reset(g)
            g.pids, g.pids_until = (), 0.0

    def _sample(self, g: _SimGpu, t: float, now: datetime) -> GpuSample:
        gauss = self._rng.gauss
        util = g.util_value if g.util_until > t else g.util
        util = min(1.0, max(0.0, util + gauss(0.0, 0.02)))
        if g.temp_until > t:
            temp = g.temp_value + gauss(0.0, 0.3)
        else:
            temp = 34.0 + 32.0 * util + gauss(0.0, 0.5)
        power = 75.0 + 560.0 * util + gauss(0.0, 8.0)
        throttle = g.throttle if g.throttle_until > t else _NO_REASONS
        active = util > 0.05
        return GpuSample(
            uuid=g.uuid,
            at=now,
            temperature_c=round(temp, 1),
            memory_temperature_c=round(temp + 6.0, 1),
            slowdown_temperature_c=H100_SLOWDOWN_C,
            shutdown_temperature_c=H100_SHUTDOWN_C,
            power_w=round(min(power, H100_POWER_LIMIT_W), 1),
            power_limit_w=H100_POWER_LIMIT_W,
            utilization_ratio=round(util, 3),
            memory_utilization_ratio=round(util * 0.6, 3),
            memory_used_bytes=int(H100_MEMORY_BYTES * (0.2 + 0.7 * util)),
            memory_total_bytes=H100_MEMORY_BYTES,
            sm_clock_hz=1.98e9 if active else 3.45e8,
            memory_clock_hz=2.619e9,
            throttle_reasons=throttle,
            ecc_sbe_volatile=g.sbe,
            ecc_dbe_volatile=g.dbe,
            ecc_sbe_aggregate=g.sbe_agg,
            ecc_dbe_aggregate=g.dbe_agg,
            retired_pages_sbe=None,
            retired_pages_dbe=None,
            retired_pages_pending=g.retired_pending,
            remapped_rows_correctable=0,
            remapped_rows_uncorrectable=1 if g.remap_pending or g.remap_failure else 0,
            row_remap_pending=g.remap_pending,
            row_remap_failure=g.remap_failure,
            pcie_replay_count=g.pcie,
            nvlink_links_up=NVLINKS - (g.nvlink_down if g.down_until > t else 0),
            nvlink_links_total=NVLINKS,
            nvlink_errors=g.nvlink_errors,
            fan_speed_ratio=None,
            performance_state=0 if active else 8,
            mig_mode=False,
            mig_instances=0,
            fabric=self._fabric(g, t),
        )

    def _fabric(self, g: _SimGpu, t: float) -> FabricInfo | None:
        """A registered member of the scenario's NVLink domain (none without one)."""
        domain = self.scenario.fabric
        if domain is None:
            return None
        cluster, _, clique = domain.rpartition(".")
        state = g.fabric_state if g.fabric_state_until > t else "completed"
        return FabricInfo(
            state=state,  # type: ignore[arg-type]
            cluster_uuid=cluster if state == "completed" else "",
            clique_id=int(clique) if state == "completed" else 0,
            health=g.fabric_health if g.fabric_health_until > t else _NO_REASONS,
        )

    def _fire(self, ev: ScenarioFault, t: float, now: datetime, sink: ObservationSink) -> None:
        """A fault of the GPUs."""
        until = t + (ev.duration_s if ev.duration_s is not None else float("inf"))
        targets = self._gpus if ev.gpu is None else [self._gpus[ev.gpu]]
        src: SourceName = "sim"
        for g in targets:
            k, v = ev.kind, ev.value
            if k == "xid":
                sink(
                    XidObservation(
                        source=src,
                        xid=_int(v),
                        at=now,
                        uuid=g.uuid,
                        pci=PciAddress.parse(g.identity.pci_bus_id),
                        pid=ev.pid,
                        process_name=ev.process,
                        message=ev.message,
                    )
                )
            elif k == "sbe":
                g.sbe += _int(v)
                g.sbe_agg += _int(v)
            elif k == "dbe":
                g.dbe += _int(v)
                g.dbe_agg += _int(v)
                sink(EccObservation(source=src, uuid=g.uuid, at=now, double_bit=True))
            elif k == "row_remap":
                g.remap_pending = g.remap_pending or v == "pending"
                g.remap_failure = g.remap_failure or v == "failure"
            elif k == "retired_pages_pending":
                g.retired_pending = True
            elif k == "temperature":
                g.temp_value, g.temp_until = _float(v), until
            elif k == "throttle":
                g.throttle, g.throttle_until = frozenset(_strs(v)), until
            elif k == "hang":
                g.hang_until = until
            elif k == "utilization":
                g.util_value, g.util_until = _float(v), until
            elif k == "nvlink_down":
                g.nvlink_down, g.down_until = _int(v), until
            elif k == "nvlink_errors":
                g.nvlink_errors += _int(v)
            elif k == "pcie_replays":
                g.pcie += _int(v)
            elif k == "lost":
                g.lost = True
                sink(
                    LivenessObservation(
                        source=src, kind="lost", at=now, uuid=g.uuid, detail="simulated GPU_IS_LOST"
                    )
                )
            elif k == "missing":
                g.missing = True
                sink(self.inventory())
            elif k == "processes":
                g.pids, g.pids_until = tuple(int(p) for p in _strs(v)), until
            elif k == "reset":
                self._reset(g)
            elif k in ("fabric_state", "fabric_health", "sxid", "operational_event"):
                _record_fault(g, ev, until, now, sink)
        if ev.kind == "reset":
            sink(
                ResetObservation(
                    source=src,
                    at=now,
                    uuid=None if ev.gpu is None else targets[0].uuid,
                    reason="reboot" if ev.gpu is None else "reset",
                )
            )
            if any(not g.missing for g in targets):
                sink(self.inventory())

    def _inject(
        self,
        ev: ScenarioFault,
        t: float,
        now: datetime,
        sink: ObservationSink,
        *,
        count: bool = True,
    ) -> None:
        """One scenario fault: a NIC's (the scenario checked that it has the NIC), or the
        GPUs'. ``count``: in ``sim_faults`` (not when replayed after a simulated reboot)."""
        if count:
            self.counters.inc(SIM_FAULTS)
        nic = self._nics.get(ev.nic or "") if ev.kind in RAIL_KINDS else None
        if nic is None:
            self._fire(ev, t, now, sink)
        else:
            nic.fire(ev, t, t + (ev.duration_s if ev.duration_s is not None else float("inf")))

    @staticmethod
    def _reset(g: _SimGpu) -> None:
        g.sbe = g.dbe = 0
        g.remap_pending = g.retired_pending = g.lost = g.missing = False
        g.hang_until = 0.0


def _record_fault(
    g: _SimGpu, ev: ScenarioFault, until: float, now: datetime, sink: ObservationSink
) -> None:
    """Faults the driver reports as records of their own: a GPU Operational Event; the NVLink
    fabric's registration state or health flags for a while; a fatal NVSwitch error of the
    node (once, from the fault's GPU)."""
    if ev.kind == "operational_event":
        sink(op_observation(_strs(ev.value), g.uuid, now))
    elif ev.kind == "fabric_state":
        g.fabric_state, g.fabric_state_until = str(ev.value), until
    elif ev.kind == "fabric_health":
        g.fabric_health, g.fabric_health_until = frozenset(_strs(ev.value)), until
    else:
        message = ev.message or "simulated NVSwitch error"
        sink(
            SxidObservation(
                source="sim", sxid=_int(ev.value), at=now, fatal=True, switch=0, message=message
            )
        )


def _discard(_: object) -> None:
    pass


def _int(v: object) -> int:
    return int(v) if isinstance(v, int | float) else 0


def _float(v: object) -> float:
    return float(v) if isinstance(v, int | float) else 0.0


def _strs(v: object) -> tuple[str, ...]:
    return v if isinstance(v, tuple) else ()
