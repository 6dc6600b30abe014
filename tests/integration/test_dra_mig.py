"""DRA device taints on a node with MIG, against a real kube-apiserver: a ResourceSlice shaped
like the NVIDIA DRA driver's (a full GPU, and MIG devices with ``uuid`` and ``parentUUID``),
an unhealthy parent GPU taints every MIG device carved from it, a fault confined to one GPU
instance taints only its MIG devices, recovery removes them all, and the hard-write gate
counts one GPU's rules as one node."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
import pytest

from gpuhealth.controller.app import Controller
from gpuhealth.controller.kube.rest import request
from gpuhealth.protocol import Condition, MigDeviceInfo
from localkube import ControlPlane
from tests.integration.controller_helpers import UNHEALTHY, Cluster, cluster
from tests.support.protocol import XID79, fault, gpu_status, gpu_uuid, hello, recovery, snapshot
from tests.support.wait import until

pytestmark = pytest.mark.integration

RULES = "/apis/resource.k8s.io/v1beta2/devicetaintrules"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
DRIVER = "gpu.nvidia.com"
# GPU 1 is in MIG mode: GPU instances 1, 2 and 9 (gi, ci, profile, profile id, placement)
MIG_LAYOUT = ((1, 0, "3g.40gb", 9, 0), (2, 0, "2g.20gb", 14, 4), (9, 0, "1g.10gb", 19, 6))


def mig_uuid(node: str, gi: int, ci: int) -> str:
    return f"MIG-{node}-{gi}-{ci}"


def _device_name(gi: int, ci: int, profile: str, pid: int, start: int) -> str:
    """The driver's canonical name: gpu-<parent minor>-mig-<profile>-<profile id>-<start>."""
    return f"gpu-1-mig-{profile.replace('.', '')}-{pid}-{start}"


def _slice_body(node: str) -> dict[str, Any]:
    full = {
        "name": "gpu-0",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": gpu_uuid(0, node)},
            "productName": {"string": "NVIDIA A100-SXM4-80GB"},
            "driverVersion": {"version": "570.124.6"},
        },
        "capacity": {"memory": {"value": "80Gi"}},
    }
    migs = [
        {
            "name": _device_name(gi, ci, profile, pid, start),
            "attributes": {
                "type": {"string": "mig"},
                "uuid": {"string": mig_uuid(node, gi, ci)},
                "parentUUID": {"string": gpu_uuid(1, node)},
                "profile": {"string": profile},
                "productName": {"string": "NVIDIA A100-SXM4-80GB"},
            },
            "capacity": {"multiprocessors": {"value": "14"}},
        }
        for gi, ci, profile, pid, start in MIG_LAYOUT
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [full, *migs],
        },
    }


def _agent_snapshot(node: str) -> Any:
    """The agent's Snapshot: GPU 1 reports its MIG devices (GpuInfo.mig_devices)."""
    base = gpu_status(1, node=node)
    info = msgspec.structs.replace(
        base.info,
        mig_enabled=True,
        mig_devices=[
            MigDeviceInfo(uuid=mig_uuid(node, gi, ci), gpu_instance_id=gi, compute_instance_id=ci)
            for gi, ci, *_ in MIG_LAYOUT
        ],
    )
    return snapshot(node, [gpu_status(0, node=node), msgspec.structs.replace(base, info=info)])


def _connect_mig_node(ctl: Controller, node: str) -> None:
    ctl.parts.fleet.on_connect(node, hello(node, 2))
    ctl.parts.fleet.on_message(node, _agent_snapshot(node))


async def _rules(kube: Cluster, node: str) -> dict[str, dict[str, Any]]:
    """The node's DeviceTaintRules by the device they select."""
    data = await request(
        kube.api, "GET", RULES, query=[("labelSelector", "gpuhealth.io/managed=true")]
    )
    return {
        r["spec"]["deviceSelector"]["device"]: r
        for r in data.get("items") or []
        if r["metadata"].get("annotations", {}).get("gpuhealth.io/node") == node
    }


async def _rules_become(
    kube: Cluster, node: str, devices: set[str], what: str
) -> dict[str, dict[str, Any]]:
    async def check() -> tuple[dict[str, dict[str, Any]]] | None:
        got = await _rules(kube, node)
        return (got,) if set(got) == devices else None

    found: tuple[dict[str, dict[str, Any]]] = await until(check, what, timeout_s=30)
    return found[0]


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[Cluster]:
    async with cluster(control_plane) as c:
        yield c


ALL_MIG = {_device_name(*layout) for layout in MIG_LAYOUT}
GI2 = {_device_name(*layout) for layout in MIG_LAYOUT if layout[0] == 2}
# a fault the driver attributed to GPU instance 2 that touches only that instance's processes
GI2_FAULT = Condition(
    reason="XidError",
    code="xid-13",
    severity="unhealthy",
    action="RESTART_APP",
    xid=13,
    gpu_instance=2,
    compute_instance=0,
)


async def test_a_mig_gpu_taints_its_mig_devices_by_scope_and_recovery_removes_them(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    node = await kube.node(unique_name("dra-mig"))
    await request(kube.api, "POST", SLICES, body=_slice_body(node))
    try:
        ctl = await kube.controller()
        _connect_mig_node(ctl, node)
        fleet = ctl.parts.fleet

        # a fault confined to GPU instance 2: its MIG device, nothing else
        fleet.on_message(node, fault(node, 1, GI2_FAULT))
        rules = await _rules_become(kube, node, GI2, "the rules of GPU instance 2")
        for device, rule in rules.items():
            assert rule["spec"]["deviceSelector"] == {
                "driver": DRIVER,
                "pool": node,
                "device": device,
            }
            taint = rule["spec"]["taint"]
            assert (taint["key"], taint["value"], taint["effect"]) == (
                UNHEALTHY,
                "xid-13",
                "NoSchedule",
            )
            notes = rule["metadata"]["annotations"]
            assert notes["gpuhealth.io/gpu-uuid"] == gpu_uuid(1, node)
            assert notes["gpuhealth.io/device-uuid"] == mig_uuid(node, 2, 0)

        # the parent GPU fails: every MIG device carved from it, value updated
        fleet.on_message(node, fault(node, 1, XID79))
        rules = await _rules_become(kube, node, ALL_MIG, "a rule per MIG device of GPU 1")
        assert {r["spec"]["taint"]["value"] for r in rules.values()} == {"xid-79"}

        # GPU 0 (a full GPU) fails too: its own device
        fleet.on_message(node, fault(node, 0, XID79))
        rules = await _rules_become(kube, node, ALL_MIG | {"gpu-0"}, "GPU 0's rule as well")
        assert rules["gpu-0"]["metadata"]["name"] == f"gpuhealth-{node}-gpu-{node}-0".lower()

        fleet.on_message(node, recovery(node, 1))
        await _rules_become(kube, node, {"gpu-0"}, "GPU 1's rules removed on recovery")
        fleet.on_message(node, recovery(node, 0))
        await _rules_become(kube, node, set(), "every rule removed")
    finally:
        await request(kube.api, "DELETE", f"{SLICES}/{node}-{DRIVER}")


async def test_one_mig_gpus_rules_cost_one_node_of_the_hard_write_budget(
    kube: Cluster, unique_name: Callable[[str], str]
) -> None:
    """The breaker admits one node: that node gets every MIG device rule of its GPU (one
    request to the gate), the other node none until the breaker is reset."""
    names = [await kube.node(unique_name(f"dra-mig-gate{i}")) for i in range(2)]
    await asyncio.gather(*(request(kube.api, "POST", SLICES, body=_slice_body(n)) for n in names))
    try:
        ctl = await kube.controller({"breaker": {"max_fraction": 0.0, "min_nodes": 1}})
        dra = ctl.parts.dra
        assert dra is not None
        await until(lambda: dra.rule_version is not None, "DRA discovered", timeout_s=30)
        for n in names:
            _connect_mig_node(ctl, n)
        await kube.settle(ctl)
        for n in names:
            ctl.parts.fleet.on_message(n, fault(n, 1, XID79))

        async def decided() -> tuple[str, str] | None:
            with_rules = [n for n in names if await _rules(kube, n)]
            if len(with_rules) == 1 and dra.blocked == set(names) - set(with_rules):
                return with_rules[0], next(n for n in names if n not in with_rules)
            return None

        admitted, blocked = await until(decided, "one node admitted, one blocked", timeout_s=30)
        assert set(await _rules(kube, admitted)) == ALL_MIG  # the whole GPU, one budget
        assert await _rules(kube, blocked) == {}

        ctl.parts.gate.reset(by="test")
        await _rules_become(kube, blocked, ALL_MIG, "the blocked node's rules after a reset")
    finally:
        for n in names:
            await request(kube.api, "DELETE", f"{SLICES}/{n}-{DRIVER}")
