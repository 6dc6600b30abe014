"""What the demo reads from its processes: agents' status and metrics, the controller's
fleet, and ``gpuhealth-controller status`` run as a user would."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from demo import cluster
from demo.procs import Launched
from gpuhealth.agent.sources.sim.scenario import parse_scenario
from gpuhealth.agent.sources.sim.source import SimSource
from gpuhealth.common.clock import SystemClock

XID_COUNTER = "gpuhealth_gpu_xid_errors"
"""The agent's XID counter family (``_total`` samples), docs/metrics.md."""


async def status_cli(url: str, timeout_s: float) -> tuple[int, str]:
    """``gpuhealth-controller status --url URL``, run as a user would."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpuhealth.controller.cli", "status", "--url", url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        output, _ = await asyncio.wait_for(proc.communicate(), timeout_s * 3)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return -1, "(timed out)"
    return proc.returncode or 0, output.decode(errors="replace").rstrip()


async def agent_xids(http: aiohttp.ClientSession, agent: Launched) -> set[int]:
    """XIDs with a non-zero count in the agent's ``/metrics``."""
    async with http.get(agent.url + "/metrics") as resp:
        resp.raise_for_status()
        text = await resp.text()
    return {
        int(sample.labels["xid"])
        for family in text_string_to_metric_families(text)
        if family.name == XID_COUNTER
        for sample in family.samples
        if sample.name.endswith("_total") and sample.value > 0 and "xid" in sample.labels
    }


async def get_json(http: aiohttp.ClientSession, url: str) -> Any:
    """GET ``url`` as JSON; raises ``aiohttp.ClientError`` on a non-2xx answer."""
    async with http.get(url) as resp:
        resp.raise_for_status()
        return await resp.json()


def sim_uuids(scenario: dict[str, Any]) -> dict[int, str]:
    """GPU index -> UUID the simulator will report for ``scenario`` (it is seeded)."""
    sim = SimSource(parse_scenario(yaml.safe_dump(scenario)), SystemClock(), seed=0)
    return {g.index: g.uuid for g in sim.inventory().gpus}


async def running_pods(api: Any, count: int) -> list[Any] | None:
    """The workload pods once ``count`` of them are bound and Running, else None."""
    pods = await cluster.workload_pods(api)
    running = [p for p in pods if p.spec.node_name and p.status.phase == "Running"]
    return pods if len(running) >= count else None


async def agent_uuids(http: aiohttp.ClientSession, agent: Launched) -> dict[int, str]:
    """GPU index -> UUID from the agent's ``/api/v1/status``."""
    doc = await get_json(http, agent.url + "/api/v1/status")
    return {int(g["index"]): str(g["uuid"]) for g in doc.get("gpus", [])}
