"""The fleet benchmark's simulated agents send what the real agent sends on a busy node.

Three recordings side by side (``bench.stream_recording``, each against its own recording
controller on 127.0.0.1), at a heartbeat a second so that a dozen come in a few seconds: the
real ``gpuhealth-agent`` process on the simulated GPU source with a kubelet PodResources server
that gives every GPU to one pod; one of ``bench.fleet_scale_agents``' agents in the ``real``
shape; and one in the ``fixed`` shape (the benchmark's agents before issue 43). The real
shape must match the real agent's recording (``bench.stream_profile.differences``: message
types and opening, sizes within 20 %, the same Heartbeat fields changing, usage for every
GPU, the interval, the figures' ranges); the fixed one must not, so the comparison can tell.
When the real agent's messages change, this notices.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from bench.stream_profile import differences, profile
from bench.stream_recording import BusyNode, record_real_agent, record_simulated_agent

SECONDS = 12.0
NODE = BusyNode(heartbeat_s=1.0, poll_s=0.25)
"""Four polls per Heartbeat, as ten at the agent's defaults: every Heartbeat has usage."""


async def test_the_simulated_agent_sends_what_the_real_agent_sends(tmp_path: Path) -> None:
    dirs = [tmp_path / d for d in ("real", "sim", "fixed")]
    for d in dirs:
        d.mkdir()
    real, sim, fixed = await asyncio.gather(
        record_real_agent(SECONDS, NODE, dirs[0]),
        record_simulated_agent(SECONDS, NODE, dirs[1], "real"),
        record_simulated_agent(SECONDS, NODE, dirs[2], "fixed"),
    )
    assert [len(real), len(sim), len(fixed)] == [1, 1, 1]  # one connection each
    r = profile(real[0])
    # What the comparison rests on: the real agent streamed a busy node's Heartbeats.
    assert r.opening[0] == "hello" and "snapshot" in r.opening
    assert r.steady.get("heartbeat", 0) >= 8
    assert r.usage_per_heartbeat == r.telemetry_per_heartbeat == 8
    assert "telemetry.power_w" in r.changing()
    assert differences(r, profile(sim[0])) == []
    told = "\n".join(differences(r, profile(fixed[0])))
    assert "heartbeat size" in told and "changing heartbeat fields" in told
