"""'Not found' after the first LIST is no answer about the collection (issue 38, item 4),
against the real kube-apiserver and the controller as composed.

The GPURemediation CRD's version is switched off (``served: false``) after the controller's
episode watch has listed it, while an episode holds its node's quarantine: the API server
then answers 404 to the LIST and the WATCH while the objects are still stored (as while a
CRD is replaced, or an API server restarts before its CRD handlers are up). The node's agent
reports healthy GPUs, so only the episode keeps the quarantine: the episode cache keeps the
episode, the reconciler releases no quarantine through its passes, and the
404s are counted (``gpuhealth_watch_not_found_total{resource="gpuremediations"}``). Served
again, the watch follows the collection: a new episode quarantines its node, and deleting an
episode for real releases its node (the same cache, live).

A real CRD deletion is another matter: the API server deletes every object of it first and
the watch delivers a DELETED event for each, as for any deletion
(``kubectl delete gpurem``, docs/remediation.md: its quarantine goes).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from prometheus_client import generate_latest

from gpuhealth.controller.app import Controller
from gpuhealth.controller.incidents.incident_store import GPUIncidentStore
from gpuhealth.controller.kube.rest import NotFoundError, request
from gpuhealth.controller.kube.settings import WatchSettings
from gpuhealth.controller.remediation.episode_store import GPURemediationStore
from gpuhealth.controller.remediation.facts import GpuFacts, NodeFacts
from gpuhealth.controller.remediation.fault import episode_name, expected_spec, failed_gpus
from gpuhealth.controller.remediation.model import Episode, Phase, initial_status
from gpuhealth.controller.remediation.status import enter
from localkube import ControlPlane
from tests.integration.controller_helpers import PREFIX, Cluster, cluster, get_node, our_taints
from tests.integration.remediation_helpers import CRD_NAME, install_crd, quick, xid48
from tests.support.fleet import connect
from tests.support.protocol import T0
from tests.support.wait import until

pytestmark = pytest.mark.integration

CRD_PATH = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}"
INCIDENT_CRD_PATH = (
    "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/gpuincidents.gpuhealth.io"
)
QUARANTINE = (f"{PREFIX}/remediation", "reset-gpu", "NoSchedule")
SETTINGS = {
    "watch": {"relist_backoff_s": 0.2, "relist_backoff_max_s": 1.0},
    "breaker": {"max_fraction": 1.0},  # two quarantines in a two-node test are no storm
}


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[Cluster]:
    async with cluster(control_plane) as c:
        await install_crd(c.api)
        yield c


async def _served(kube: Cluster, served: bool, path: str = CRD_PATH) -> None:
    crd = await request(kube.api, "GET", path)
    for version in crd["spec"]["versions"]:
        version["served"] = served
    await request(kube.api, "PUT", path, body=crd)


async def _quarantined_episode(kube: Cluster, node: str) -> Episode:
    """An episode of ``node`` in Quarantined, as the loop leaves it (written by the admin)."""
    facts = NodeFacts(
        name=node,
        boot_id="b1",
        gpus=(GpuFacts(uuid=f"GPU-{node}", index=0, state="unhealthy", conditions=(xid48(),)),),
    )
    spec = expected_spec(
        node, "b1", failed_gpus(facts), detected_at=T0, history=(), settings=quick()
    )
    assert spec is not None
    store = GPURemediationStore(kube.api)
    ep = await store.create(episode_name(node, spec.fault.fingerprint), spec, {})
    assert ep is not None
    status = enter(initial_status(T0), Phase.QUARANTINED, T0, "Admitted")
    return await store.write_status(ep, status)


def _sample(ctl: Controller, line_start: str) -> float | None:
    for line in generate_latest(ctl.parts.registry).decode().splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def _not_found(ctl: Controller) -> float:
    return _sample(ctl, 'gpuhealth_watch_not_found_total{resource="gpuremediations"}') or 0.0


def _quarantined(ctl: Controller) -> float:
    return _sample(ctl, 'gpuhealth_remediation_episodes_by_phase{phase="Quarantined"}') or 0.0


async def _taints(kube: Cluster, node: str) -> list[tuple[str, str, str]]:
    return our_taints(await get_node(kube.api, node))


async def test_a_404_after_the_first_list_keeps_every_episode_and_its_quarantine(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    held = await kube.node(unique_name("held"))
    ep = await _quarantined_episode(kube, held)
    ctl = await kube.controller(SETTINGS)
    connect(ctl.parts.fleet, held)  # its agent reports healthy GPUs: only the episode holds it

    async def has(node: str, taints: list[Any]) -> bool | None:
        return True if await _taints(kube, node) == taints else None

    await until(lambda: has(held, [QUARANTINE]), "the episode's quarantine on its node")
    assert _quarantined(ctl) == 1.0
    try:
        await _served(kube, False)
        await until(lambda: _not_found(ctl) >= 3, "404s on the episodes' LIST and WATCH")
        for _ in range(3):  # passes of the reconciler while the API server says "not found"
            ctl.parts.reconciler.enqueue(held)
            await kube.settle(ctl)
            assert await _taints(kube, held) == [QUARANTINE]
        assert _quarantined(ctl) == 1.0  # the episode is still in the cache
    finally:
        await _served(kube, True)

    # Served again: the watch follows the collection, new episodes and deletions alike.
    other = await kube.node(unique_name("other"))
    connect(ctl.parts.fleet, other)
    await _quarantined_episode(kube, other)
    await until(lambda: has(other, [QUARANTINE]), "a new episode's quarantine", timeout_s=30)
    assert _quarantined(ctl) == 2.0
    await GPURemediationStore(kube.api).delete(ep.name)
    await until(lambda: has(held, []), "the deleted episode's quarantine released")
    assert await _taints(kube, other) == [QUARANTINE]


async def test_the_adoption_list_takes_a_404_as_nothing_only_before_the_watch_listed(
    kube: Cluster,
) -> None:
    """A new leader's adoption LIST of the GPUIncidents (``GPUIncidentStore.list_now``): a
    404 is "nothing stored" only while this replica's watch has never listed the collection
    (no CRD yet); once it has, the 404 is raised, and the adoption retries it (a successor
    that took it as no incidents lifted every domain taint and blame:
    ``tests/integration/test_failover_fleet.py`` [404])."""
    settings = WatchSettings(relist_backoff_s=0.2, relist_backoff_max_s=0.5)
    watching, fresh = GPUIncidentStore(kube.api, settings), GPUIncidentStore(kube.api, settings)
    task = asyncio.create_task(watching.run(), name="test-incident-watch")
    try:
        await asyncio.wait_for(watching.synced.wait(), 15)
        assert watching.informer.has_listed
        await _served(kube, False, INCIDENT_CRD_PATH)
        await until(lambda: watching.informer.not_found >= 1, "the watch answered 404")
        with pytest.raises(NotFoundError):
            await watching.list_now()
        assert await fresh.list_now() == []  # never listed here: no CRD, nothing stored
    finally:
        await _served(kube, True, INCIDENT_CRD_PATH)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
