"""NVLink domain incidents against a real kube-apiserver: 18 kwok nodes labelled into one
NVL72 domain (GPU feature discovery's ``nvidia.com/gpu.clique``), agents' reports through the
controller's fleet, a fabric fault on 4 of them -> ONE domain incident, all 18 nodes tainted
for fabric work (or all held by the breaker, never some), nothing tainted outside the domain,
and the taint gone when the fabric recovers."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime

import pytest

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
    kube: Cluster, unique_name: Callable[[str], str], breaker: dict[str, object]
) -> tuple[object, str, list[str], list[str]]:
    domain = f"{CLUSTER}.{unique_name('c')[-6:].replace('-', '')}"
    label = {"nvidia.com/gpu.clique": domain}
    rack = [await kube.node(unique_name(f"tray{i}"), kwok=True, labels=label) for i in range(18)]
    other = {"nvidia.com/gpu.clique": f"{CLUSTER}.99"}
    outside = [
        await kube.node(unique_name("other0"), kwok=True, labels=other),
        await kube.node(unique_name("other1"), kwok=True, labels=other),
        await kube.node(unique_name("hgx"), kwok=True),
    ]
    ctl = await kube.controller({"breaker": breaker, "domains": {"window_s": 60.0}})
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
