"""The engine and the rails: a NIC port's verdicts land on the GPUs behind it, by their PCI
address through the inventory, as conditions the controller's policy already taints on."""

from __future__ import annotations

from dataclasses import replace

from gpuhealth.agent.health import HealthEngine, HealthSettings
from gpuhealth.agent.health.engine import RDMA_RESETS_SEEN
from gpuhealth.agent.health.rail_settings import RailSettings
from gpuhealth.agent.health.rails import RailGpu
from gpuhealth.agent.health.transition import Transition
from gpuhealth.agent.observations import (
    GpuSample,
    Inventory,
    NicObservation,
    NicPortSample,
    PciAddress,
    ResetObservation,
)
from tests.support.agent import gpu_address, identity, port_up, uuid
from tests.support.clock import FakeClock

UP = port_up((0, 1), counters={"link_downed": 0})
DOWN = replace(UP, port_state="DOWN", phys_state="Polling", counters={"link_downed": 1})


class Rig:
    def __init__(self, gpus: int = 3, **rails: object) -> None:
        self.clock = FakeClock()
        self.engine = HealthEngine(
            HealthSettings(),
            self.clock,
            RailSettings(**rails),  # type: ignore[arg-type]
        )
        self.out: list[Transition] = []
        self.observe(Inventory(source="sim", gpus=tuple(identity(i) for i in range(gpus))))
        for i in range(gpus):
            self.observe(GpuSample(uuid=uuid(i), at=self.clock.now()))

    def observe(self, obs: object) -> None:
        self.out += self.engine.observe(obs)  # type: ignore[arg-type]

    def poll(self, *ports: NicPortSample, unread: frozenset[str] = frozenset()) -> None:
        self.observe(NicObservation(source="rdma", at=self.clock.now(), ports=ports, unread=unread))
        self.clock.advance(10.0)

    def states(self) -> dict[int, tuple[str, set[str]]]:
        return {
            s.info.index: (s.state, {c.code for c in s.conditions}) for s in self.engine.statuses()
        }


def test_a_down_port_degrades_the_gpus_behind_it_only() -> None:
    r = Rig(flap_threshold=100)
    r.out.clear()
    r.poll(UP)
    r.poll(DOWN)
    assert r.out == []  # one poll is noise
    r.poll(DOWN)
    assert r.states() == {
        0: ("degraded", {"rail-down"}),
        1: ("degraded", {"rail-down"}),
        2: ("healthy", set()),
    }
    assert sorted((t.index, t.previous, t.current) for t in r.out) == [
        (0, "healthy", "degraded"),
        (1, "healthy", "degraded"),
    ]
    cond = r.engine.statuses()[0].conditions[0]
    assert cond.scope == "rail" and cond.action == "CHECK_NETWORK"
    assert "mlx5_0 port 1" in cond.message
    r.out.clear()
    r.poll(DOWN)
    assert r.out == []  # the verdict holds: no new transition per poll


def test_hard_where_the_operator_says() -> None:
    r = Rig(flap_threshold=100, down_severity="unhealthy")
    for smp in (UP, DOWN, DOWN):
        r.poll(smp)
    assert r.states()[0] == ("unhealthy", {"rail-down"})


def test_it_clears_after_the_clean_window_through_the_ticks() -> None:
    r = Rig(flap_threshold=100, clean_window_s=30.0)
    for smp in (UP, DOWN, DOWN, UP):
        r.poll(smp)
    assert r.states()[0][1] == {"rail-down"}
    r.out.clear()
    r.clock.advance(30.0)
    r.out += r.engine.tick()
    assert r.states()[0] == ("healthy", set())
    assert sorted((t.index, t.current) for t in r.out) == [(0, "healthy"), (1, "healthy")]


def test_a_gpu_reset_keeps_and_an_operator_clear_drops_a_rail_verdict() -> None:
    r = Rig(flap_threshold=100)
    for smp in (UP, DOWN, DOWN):
        r.poll(smp)
    r.observe(ResetObservation(source="sim", at=r.clock.now(), uuid=uuid(0)))
    assert r.states()[0][1] == {"rail-down"}  # a GPU reset mends no cable
    r.engine.clear(uuid(0))
    assert r.states()[0] == ("healthy", set())
    r.poll(DOWN)
    assert r.states()[0] == ("healthy", set())  # its port started over: one poll is noise
    r.poll(DOWN)
    assert r.states()[0][1] == {"rail-down"}


def test_ports_before_the_inventory_wait_for_it() -> None:
    clock = FakeClock()
    e = HealthEngine(HealthSettings(), clock, RailSettings(flap_threshold=100))
    for smp in (UP, DOWN, DOWN):
        e.observe(NicObservation(source="rdma", at=clock.now(), ports=(smp,)))
        clock.advance(10.0)
    assert e.statuses() == []
    e.observe(Inventory(source="nvml", gpus=(identity(0),)))
    assert {c.code for c in e.statuses()[0].conditions} == {"rail-down"}


def test_the_ports_as_readers_see_them() -> None:
    r = Rig()
    stray = replace(UP, device="mlx5_9", gpus=(PciAddress(0, 0xEE, 0, 0),))
    v = r.engine.nics_version
    r.poll(UP, stray)
    assert r.engine.nics_version > v
    ports = r.engine.nic_ports()
    assert [(p.sample.device, p.gpus) for p in ports] == [
        ("mlx5_0", (RailGpu(0, uuid(0)), RailGpu(1, uuid(1)))),
        ("mlx5_9", ()),  # a GPU the agent does not know: nothing reaches it
    ]
    assert ports[0].expected_rate_gbps == 400.0
    assert r.engine.gpu_addresses() == [gpu_address(i) for i in range(3)]


def test_counter_resets_are_counted() -> None:
    r = Rig()
    r.poll(replace(UP, counters={"symbol_error": 500}))
    r.poll(replace(UP, counters={"symbol_error": 2}))
    assert r.engine.counters.value(RDMA_RESETS_SEEN) == 1
