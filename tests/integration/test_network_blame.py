"""Network blame against the real API server (issue 42): a 16-node job crashes while one
node's rail flaps. The controller runs with the chart's configuration and RBAC, the Jobs and
their pods are real objects on kwok GPU nodes, and the agents' messages (their Snapshots with
the NIC ports, their XIDs) enter through the stream server's sink, as in
``test_incidents.py``.

Measured and printed (``-s``): the taints each node ends with, the blames, and the time from
the last report to the incident naming the rail."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from gpuhealth.controller.incidents.incident_store import PATH as INCIDENTS
from gpuhealth.controller.kube.rest import request
from gpuhealth.protocol import NicPortInfo
from tests.integration.controller_helpers import PREFIX, Cluster, get_node, our_taints
from tests.integration.test_incidents import (
    create_job,
    delete_namespace,
    judge_of,
    judged,
    kube,
    xid_event,
)
from tests.support.protocol import RAIL_FLAPPING, allocation, gpu_uuid, hello, nic, snapshot
from tests.support.wait import until

pytestmark = pytest.mark.integration

__all__ = ["kube"]  # the fixture


async def test_a_flapping_rail_under_a_sixteen_node_job_is_named_and_its_gpu_not_blamed(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    """Node 7's rail mlx5_0 port 1 (its GPU 0 behind it) flaps. Two short jobs on node 7 crash
    on it, then the 16-node training job crashes everywhere. Node 3's GPU faults under two
    short jobs and the training job too, with healthy rails. Node 3's GPU is blamed (the same
    shape, no rail: the blame path works); node 7's is not, its node carries only the rail's
    soft taint; the job incident names the rail, in the GPUIncident object too."""
    ns = unique_name("ml")
    await kube.namespace(ns)
    try:
        nodes = [await kube.node(unique_name(f"gpu{i}"), gpus=1, kwok=True) for i in range(16)]
        flaky, bad = nodes[7], nodes[3]
        short = {flaky: ("probe-a", "probe-b"), bad: ("check-a", "check-b")}
        for node, jobs in short.items():
            for job in jobs:
                await create_job(kube, ns, job, [(f"{job}-0", node)])
        await create_job(kube, ns, "train", [(f"train-{i}", n) for i, n in enumerate(nodes)])
        ctl = await kube.controller()
        judge = judge_of(ctl)

        def ports(node: str) -> list[NicPortInfo]:
            if node != flaky:
                return [nic(node)]
            return [
                nic(node, verdicts=["rail-flapping"], flaps=4, last_flap=datetime.now(UTC)),
                nic(node, device="mlx5_1", gpus=()),
            ]

        def report(node: str, pod: str) -> None:
            judge.on_message(
                node,
                snapshot(
                    node,
                    1,
                    faults={0: RAIL_FLAPPING} if node == flaky else None,
                    allocations=[allocation(gpu_uuid(0, node), pod, namespace=ns)],
                    nics=ports(node),
                ),
            )

        for node in nodes:
            judge.on_connect(node, hello(node, 1))
        done = 0
        for k in range(2):  # the short jobs, one after the other
            for node, jobs in short.items():
                report(node, f"{jobs[k]}-0")
                judge.on_message(node, xid_event(node, 13))
                done += 1
            await until(lambda n=done: judged(judge) >= n, "the short jobs' reports judged")
        assert judge.blamed() == {}
        for i, node in enumerate(nodes):  # the training job crashes on every rank
            report(node, f"train-{i}")
        for node in nodes:
            for _ in range(3):
                judge.on_message(node, xid_event(node, 13))
            judge.on_message(node, xid_event(node, 43))
        last_report = time.monotonic()
        assert ctl.parts.incidents is not None
        book = ctl.parts.incidents.book

        def train_incident() -> Any:
            found = book.find("job", f"{ns}/Job/train")
            return found if found is not None and found.subjects.rails else None

        train = await until(train_incident, "the training job's incident", timeout_s=20)
        delay_s = time.monotonic() - last_report
        await until(judge.blamed, "node 3's GPU blamed")
        rail = f"{flaky}/mlx5_0/1"
        assert train.subjects.rails == (rail,) and len(train.subjects.nodes) == 16
        assert f"rail {rail} went down or flapped" in train.reason
        assert train.evidence == {"nodes": 16, "gpus": 16, "reports": 64, "rails": 1}
        assert list(judge.blamed()) == [(bad, gpu_uuid(0, bad))]
        # the short jobs on node 7 crashed on its rail: their incidents are single-node
        # crashes (no job incident), and the GPU is not blamed for them either

        async def written() -> dict[str, Any] | None:
            data = await request(kube.api, "GET", INCIDENTS)
            for o in data.get("items") or []:
                st = o.get("status") or {}
                if st.get("kind") == "job" and (st.get("subjects") or {}).get("rails"):
                    return dict(st)
            return None

        stored = await until(written, "the job's GPUIncident naming the rail", timeout_s=20)
        assert stored["subjects"]["rails"] == [rail]
        assert stored["key"] == f"{ns}/Job/train"

        async def settled() -> dict[str, list[tuple[str, str, str]]] | None:
            taints = {n: our_taints(await get_node(kube.api, n)) for n in (flaky, bad)}
            want_bad = (f"{PREFIX}/unhealthy", "gpu-blamed", "NoSchedule")
            return taints if want_bad in taints[bad] and taints[flaky] else None

        taints = await until(settled, "node 3 tainted for its blame, node 7 for its rail")
        assert taints[flaky] == [(f"{PREFIX}/degraded", "rail-flapping", "PreferNoSchedule")]
        others = [n for n in nodes if n not in (flaky, bad)]
        for n in others:
            assert our_taints(await get_node(kube.api, n)) == [], n
        g7 = ctl.parts.fleet.node_health(flaky).gpus[0]
        assert g7.state == "degraded" and [c.code for c in g7.conditions] == ["rail-flapping"]
        rec = ctl.parts.fleet.node(flaky)
        assert rec is not None and [p.verdicts for p in rec.nics] == [["rail-flapping"], []]
        print(
            f"\n[network blame] 16-node job, rail {rail} flapping: incident names "
            f"{list(train.subjects.rails)} {delay_s * 1000:.0f} ms after the last report; "
            f"blamed {[k[0] == bad for k in judge.blamed()]} (node 3 only); taints node 7 "
            f"{taints[flaky]}, node 3 {taints[bad]}, the other 14 none"
        )
    finally:
        await delete_namespace(kube, ns)
