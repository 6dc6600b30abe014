"""Kernel-log XIDs carry only a PCI address: the engine maps it, and one that comes before the
first GPU inventory (the ring buffer's replay at start) waits for it instead of being lost."""

from __future__ import annotations

from datetime import UTC, datetime

from gpuhealth.agent.health.engine import (
    HELD_XIDS,
    HELD_XIDS_DROPPED,
    UNMAPPED_XIDS,
    HealthEngine,
    HealthSettings,
)
from gpuhealth.agent.observations import GpuIdentity, Inventory, PciAddress, XidObservation
from tests.support.clock import FakeClock

U0 = "GPU-00000000-1111-2222-3333-444455556666"
U1 = "GPU-00000001-1111-2222-3333-444455556666"
INVENTORY = Inventory(
    source="nvml",
    gpus=(
        GpuIdentity(index=0, uuid=U0, model="H100", pci_bus_id="00000000:1B:00.0"),
        GpuIdentity(index=1, uuid=U1, model="H100", pci_bus_id="00000000:2A:00.0"),
    ),
)


def engine(**settings: float) -> tuple[HealthEngine, FakeClock]:
    clock = FakeClock(datetime(2026, 1, 1, tzinfo=UTC))
    return HealthEngine(HealthSettings(**settings), clock), clock  # type: ignore[arg-type]


def kmsg_xid(xid: int, pci: str, taken: list[int]) -> XidObservation:
    """As the kernel-log follower hands it on: the address the log spells, no UUID."""
    return XidObservation(
        source="kmsg",
        xid=xid,
        at=datetime(2026, 1, 1, tzinfo=UTC),
        pci=PciAddress.parse(pci),
        on_taken=lambda: taken.append(xid),
    )


def take(e: HealthEngine) -> None:
    for x in e.taken():
        assert x.on_taken is not None
        x.on_taken()


def test_an_xid_before_the_inventory_is_applied_once_it_comes() -> None:
    e, _ = engine()
    taken: list[int] = []
    assert e.observe(kmsg_xid(79, "0000:2a:00", taken)) == []
    take(e)
    assert taken == [] and e.counters.value(HELD_XIDS) == 1  # not taken: the position waits
    transitions = e.observe(INVENTORY)
    take(e)
    assert [(t.uuid, t.xid) for t in transitions if t.xid is not None] == [(U1, 79)]
    assert taken == [79]
    assert e.xid_counts() == {(U1, 79): 1}
    assert e.counters.value(UNMAPPED_XIDS) == 0


def test_held_xids_are_applied_in_the_order_they_came() -> None:
    e, _ = engine()
    taken: list[int] = []
    for n in (48, 79, 13):
        e.observe(kmsg_xid(n, "0000:1b:00", taken))
    e.observe(INVENTORY)
    take(e)
    assert taken == [48, 79, 13]


def test_after_the_inventory_an_unknown_address_is_unmapped_and_taken() -> None:
    e, _ = engine()
    e.observe(INVENTORY)
    taken: list[int] = []
    assert e.observe(kmsg_xid(79, "0000:99:00", taken)) == []
    take(e)
    assert taken == [79]
    assert (e.counters.value(UNMAPPED_XIDS), e.counters.value(HELD_XIDS)) == (1, 0)


def test_no_inventory_within_the_hold_drops_them_as_unmapped() -> None:
    e, clock = engine(unmapped_xid_hold_s=60.0)
    taken: list[int] = []
    e.observe(kmsg_xid(79, "0000:1b:00", taken))
    clock.advance(59)
    e.tick()
    take(e)
    assert taken == []
    clock.advance(1)
    e.tick()
    take(e)
    assert taken == [79]
    assert e.counters.value(HELD_XIDS_DROPPED) == e.counters.value(UNMAPPED_XIDS) == 1
    e.observe(INVENTORY)
    assert e.xid_counts() == {}


def test_the_hold_is_bounded_oldest_first() -> None:
    e, _ = engine(unmapped_xid_hold_max=2)
    taken: list[int] = []
    for n in (48, 79, 13):
        e.observe(kmsg_xid(n, "0000:1b:00", taken))
    take(e)
    assert taken == [48] and e.counters.value(HELD_XIDS_DROPPED) == 1
    e.observe(INVENTORY)
    take(e)
    assert taken == [48, 79, 13]
    assert e.xid_counts() == {(U0, 79): 1, (U0, 13): 1}


def test_an_xid_with_its_uuid_is_never_held() -> None:
    e, _ = engine()
    taken: list[int] = []
    obs = XidObservation(
        source="nvml",
        xid=79,
        at=datetime(2026, 1, 1, tzinfo=UTC),
        uuid=U0,
        on_taken=lambda: taken.append(79),
    )
    assert e.observe(obs) != []
    take(e)
    assert taken == [79] and e.counters.value(HELD_XIDS) == 0
