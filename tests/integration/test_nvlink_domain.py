"""NVLink domain incidents against a real kube-apiserver: 18 kwok nodes labelled into one
NVL72 domain (GPU feature discovery's ``nvidia.com/gpu.clique``), agents' reports through the
controller's fleet, a fabric fault on 4 of them -> ONE domain incident, all 18 nodes tainted
for fabric work (or all held by the breaker, never some), nothing tainted outside the domain,
and the taint gone when the fabric recovers."""

from __future__ import annotations

import time
import zlib
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from prometheus_client import generate_latest

from gpuhealth.controller.incidents.incident_store import PATH as INCIDENTS
from gpuhealth.controller.kube.rest import request
from gpuhealth.protocol.v1 import GpuFabric
from localkube import ControlPlane
from tests.integration.controller_helpers import PREFIX, Cluster, cluster, get_node
from tests.support.fleet import connect
from tests.support.protocol import fabric_fault, snapshot
from tests.support.wait import until

pytestmark = pytest.mark.integration

DOMAIN_TAINT = f"{PREFIX}/nvlink-domain"
CLUSTER = "5f0c7e1a-2b3c-4d5e-8f90-a1b2c3d4e5f6"


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[Cluster]:
    async with cluster(control_plane) as c:
        yield c


async def domain_taints(kube: Cluster, nodes: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in nodes:
        n = await get_node(kube.api, name)
        hit = [t for t in n["spec"].get("taints") or [] if t["key"] == DOMAIN_TAINT]
        out[name] = f"{hit[0].get('value')}:{hit[0]['effect']}" if hit else None
    return out


async def setup(
    kube: Cluster,
    unique_name: Callable[[str], str],
    breaker: dict[str, object],
    domains: dict[str, object] | None = None,
) -> tuple[object, str, list[str], list[str]]:
    # the clique id as an agent reports it (a number): an agent's claim can name it
    domain = f"{CLUSTER}.{zlib.crc32(unique_name('c').encode()) % 2**31}"
    label = {"nvidia.com/gpu.clique": domain}
    rack = [await kube.node(unique_name(f"tray{i}"), kwok=True, labels=label) for i in range(18)]
    other = {"nvidia.com/gpu.clique": f"{CLUSTER}.99"}
    outside = [
        await kube.node(unique_name("other0"), kwok=True, labels=other),
        await kube.node(unique_name("other1"), kwok=True, labels=other),
        await kube.node(unique_name("hgx"), kwok=True),
    ]
    ctl = await kube.controller(
        {"breaker": breaker, "domains": {"window_s": 60.0, **(domains or {})}}
    )
    for name in rack + outside:
        connect(ctl.parts.fleet, name)
    await kube.settle(ctl)
    return ctl, domain, rack, outside


async def fault_four(ctl: object, rack: list[str], outside: list[str]) -> float:
    """A fabric fault on 4 trays of the rack (and one outside it): returns the monotonic time
    of the last report."""
    fleet = ctl.parts.fleet  # type: ignore[attr-defined]
    now = datetime.now(UTC)
    fleet.on_message(outside[0], snapshot(outside[0], 2, faults={0: fabric_fault(now)}))
    for name in rack[3:7]:
        fleet.on_message(name, snapshot(name, 2, faults={0: fabric_fault(now)}))
    return time.monotonic()


def domain_incidents(ctl: object) -> list[object]:
    book = ctl.parts.incidents.book  # type: ignore[attr-defined]
    return [i for i in book.list(kind="domain")]


async def test_four_faulty_trays_taint_the_whole_domain_once_then_it_recovers(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    ctl, domain, rack, outside = await setup(
        kube, unique_name, {"max_fraction": 1.0, "min_nodes": 100}
    )
    last_report = await fault_four(ctl, rack, outside)
    (incident,) = await until(lambda: domain_incidents(ctl) or None, "one domain incident")
    to_incident = time.monotonic() - last_report
    assert incident.key == domain  # type: ignore[attr-defined]
    assert incident.decision == "domain taint"  # type: ignore[attr-defined]
    assert sorted(incident.subjects.nodes) == sorted(rack)  # type: ignore[attr-defined]
    assert incident.evidence == {"nodes": 18, "faulty_nodes": 4}  # type: ignore[attr-defined]

    async def all_tainted() -> dict[str, str | None] | None:
        got = await domain_taints(kube, rack)
        return got if all(got.values()) else None

    got = await until(all_tainted, "all 18 trays tainted", timeout_s=30)
    to_tainted = time.monotonic() - last_report
    assert set(got.values()) == {f"{domain}:NoSchedule"}
    await kube.settle(ctl)
    false_taints = [n for n, v in (await domain_taints(kube, outside)).items() if v]
    assert false_taints == []
    assert len(domain_incidents(ctl)) == 1
    print(
        f"\nnvlink-domain: last report -> incident {to_incident * 1000:.1f} ms, "
        f"-> 18/18 nodes tainted {to_tainted * 1000:.0f} ms, false taints {len(false_taints)}"
    )

    # The fabric recovers: the incident closes and the taint goes from every tray.
    fleet = ctl.parts.fleet  # type: ignore[attr-defined]
    for name in rack[3:7]:
        fleet.on_message(name, snapshot(name, 2))

    async def none_tainted() -> bool | None:
        return True if not any((await domain_taints(kube, rack)).values()) else None

    await until(none_tainted, "the domain taint removed from every tray", timeout_s=30)
    assert domain_incidents(ctl) == []


async def test_the_breaker_holds_the_whole_domain_then_admits_it_whole(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    ctl, _domain, rack, outside = await setup(
        kube, unique_name, {"max_fraction": 0.1, "min_nodes": 1}
    )
    await fault_four(ctl, rack, outside)
    (incident,) = await until(lambda: domain_incidents(ctl) or None, "one domain incident")
    assert incident.decision == "domain held by breaker"  # type: ignore[attr-defined]
    await kube.settle(ctl)
    assert not any((await domain_taints(kube, rack)).values())  # none, never some

    ctl.parts.gate.reset(by="test")  # type: ignore[attr-defined]
    ctl.parts.breaker.settings = ctl.parts.breaker.settings.__class__(  # type: ignore[attr-defined]
        max_fraction=1.0, min_nodes=100
    )

    async def all_tainted() -> bool | None:
        got = await domain_taints(kube, rack)
        return True if all(got.values()) else None

    await until(all_tainted, "all 18 trays tainted after the reset", timeout_s=30)
    (incident,) = domain_incidents(ctl)
    assert incident.decision == "domain taint"  # type: ignore[attr-defined]


OPEN_BREAKER = {"max_fraction": 1.0, "min_nodes": 100}


async def all_tainted(kube: Cluster, nodes: list[str]) -> bool | None:
    return True if all((await domain_taints(kube, nodes)).values()) else None


async def none_tainted(kube: Cluster, nodes: list[str]) -> bool | None:
    return True if not any((await domain_taints(kube, nodes)).values()) else None


async def test_faulted_trays_that_go_silent_keep_the_incident_and_the_taint(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    """The four trays the fault crashed stop reporting (their agents gone): a silent member is
    not a recovered one. The incident and the taint on all 18 stay through many evaluations,
    and go once those trays report a healthy fabric again."""
    ctl, _domain, rack, outside = await setup(
        kube, unique_name, OPEN_BREAKER, {"evaluate_interval_s": 0.2}
    )
    await fault_four(ctl, rack, outside)
    await until(lambda: all_tainted(kube, rack), "all 18 trays tainted", timeout_s=30)
    fleet = ctl.parts.fleet  # type: ignore[attr-defined]
    for name in rack[3:7]:
        fleet.on_disconnect(name)
    for _ in range(10):  # ten evaluations: nothing closes, nothing is removed
        before = time.monotonic()
        await until(lambda b=before: time.monotonic() - b > 0.25, "an evaluation interval")
    await kube.settle(ctl)
    (incident,) = domain_incidents(ctl)
    assert incident.evidence["waiting_nodes"] == 4  # type: ignore[attr-defined]
    assert await all_tainted(kube, rack)
    for name in rack[3:7]:
        connect(fleet, name)  # back, healthy
    await until(lambda: none_tainted(kube, rack), "the taint removed", timeout_s=30)
    assert domain_incidents(ctl) == []
    print("\nnvlink-domain: 4 faulted trays silent for 10 evaluations: incident and 18 taints kept")


async def test_a_rack_whose_trays_fault_six_minutes_apart_is_one_incident(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    ctl, domain, rack, _outside = await setup(kube, unique_name, OPEN_BREAKER)
    fleet = ctl.parts.fleet  # type: ignore[attr-defined]
    now = datetime.now(UTC)
    first = rack[2]
    fleet.on_message(
        first, snapshot(first, 2, faults={0: fabric_fault(now - timedelta(minutes=6))})
    )
    fleet.on_message(rack[11], snapshot(rack[11], 2, faults={0: fabric_fault(now)}))
    (incident,) = await until(lambda: domain_incidents(ctl) or None, "one domain incident")
    assert incident.key == domain and "within 360s" in incident.reason  # type: ignore[attr-defined]
    await until(lambda: all_tainted(kube, rack), "all 18 trays tainted", timeout_s=30)


async def test_a_rogue_agent_claiming_another_racks_clique_keeps_nothing_open(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    """Rack B's incident closes once B's own trays report healthy, though a tray of another
    domain (its clique label says so) keeps claiming B's clique with a fabric fault; that tray
    is never tainted and gets a Warning Event."""
    ctl, domain, rack, outside = await setup(kube, unique_name, OPEN_BREAKER)
    fleet = ctl.parts.fleet  # type: ignore[attr-defined]
    rogue = outside[0]  # labelled clique .99
    uuid, _, clique = domain.rpartition(".")
    claim = GpuFabric(state="completed", cluster_uuid=uuid, clique_id=int(clique))
    assert claim.domain == domain  # the rack's own fabric membership, as its agents report it
    now = datetime.now(UTC)
    snap = snapshot(rogue, 2, faults={0: fabric_fault(now)})
    fleet.on_message(
        rogue,
        msgspec.structs.replace(
            snap, gpus=[msgspec.structs.replace(g, fabric=claim) for g in snap.gpus]
        ),
    )
    registry = ctl.parts.registry  # type: ignore[attr-defined]
    await until(
        lambda: (
            "gpuhealth_nvlink_domain_mismatch_nodes 1.0" in generate_latest(registry).decode()
            or None
        ),
        "the claim counted as a mismatch",
    )
    for name in rack[3:5]:
        fleet.on_message(name, snapshot(name, 2, faults={0: fabric_fault(now)}))
    (incident,) = await until(lambda: domain_incidents(ctl) or None, "rack B's incident")
    assert rogue not in incident.subjects.nodes  # type: ignore[attr-defined]
    await until(lambda: all_tainted(kube, rack), "rack B tainted", timeout_s=30)
    for name in rack[3:5]:
        fleet.on_message(name, snapshot(name, 2))
    await until(lambda: none_tainted(kube, rack), "rack B's taint removed", timeout_s=30)
    await kube.settle(ctl)
    assert domain_incidents(ctl) == [] and not any((await domain_taints(kube, [rogue])).values())

    async def mismatch_event() -> list[dict[str, object]] | None:
        data = await request(
            kube.api,
            "GET",
            "/api/v1/namespaces/default/events",
            query=[("fieldSelector", f"involvedObject.name={rogue},reason=NvlinkDomainMismatch")],
        )
        return list(data.get("items") or []) or None

    [event] = (await until(mismatch_event, "the Warning Event on the rogue tray"))[:1]
    assert event["type"] == "Warning" and domain in str(event["message"])


async def test_trays_joining_a_tainted_domain_pass_the_breaker_like_any_node(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    """The 18-tray domain is tainted (budget 19); three trays join it later (their clique
    label set): those over the budget are held, untainted, while the 18 keep their taint (no
    trip-then-taint), the held ones are stored for a successor, and a breaker reset admits
    them."""
    ctl, domain, rack, outside = await setup(
        kube, unique_name, {"max_fraction": 0.01, "min_nodes": 19}, {"evaluate_interval_s": 0.2}
    )
    await fault_four(ctl, rack, outside)
    await until(lambda: all_tainted(kube, rack), "all 18 trays tainted", timeout_s=30)
    label = {"nvidia.com/gpu.clique": domain}
    late = [await kube.node(unique_name(f"late{i}"), kwok=True, labels=label) for i in range(3)]
    for name in late:
        connect(ctl.parts.fleet, name)  # type: ignore[attr-defined]

    def held() -> object | None:
        (incident,) = domain_incidents(ctl)
        d = incident.domain  # type: ignore[attr-defined]
        return incident if d is not None and len(d.members) == 21 and len(d.held) >= 2 else None

    # One newcomer fits the budget (19) if it is seen alone, none if all three are seen
    # together: either way the others are held and the breaker trips once.
    incident = await until(held, "the newcomers over the budget held")
    held_now = sorted(incident.domain.held)  # type: ignore[attr-defined]
    admitted = [n for n in late if n not in held_now]
    assert set(held_now) <= set(late) and len(admitted) <= 1
    await kube.settle(ctl)
    assert await all_tainted(kube, rack + admitted) and await none_tainted(kube, held_now)
    assert ctl.parts.breaker.is_open  # type: ignore[attr-defined]

    async def stored_held() -> list[str] | None:
        data = await request(kube.api, "GET", INCIDENTS)
        for o in data.get("items") or []:
            d = (o.get("status") or {}).get("domain") or {}
            if (o.get("status") or {}).get("key") == domain and d.get("held"):
                return sorted(d["held"])
        return None

    assert await until(stored_held, "the held trays stored") == held_now
    ctl.parts.gate.reset(by="test")  # type: ignore[attr-defined]
    await until(lambda: all_tainted(kube, late), "the newcomers tainted after the reset")
    assert await all_tainted(kube, rack)
