"""Status page and status CLI at fleet scale (pure CPU, no servers).

- ``overview_ms_p50``: building and encoding ``/api/v1/overview`` (the page's poll; built
  at most once a second, whatever the number of open pages) for 5,000 nodes x 8 GPUs with
  1 % of GPUs unhealthy and taints on those nodes.
- ``overview_vs_encode``: that time over the time of encoding the finished document alone
  (the same bytes out, measured back to back in each round): what building costs, whatever
  the load.
- ``status_table_ms_p50``: rendering ``gpuhealth-controller status`` for the same fleet
  (its ``/api/v1/fleet`` document).
7 rounds each.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import msgspec

from bench.registry import Benchmark, Target
from gpuhealth.common.clock import FakeClock
from gpuhealth.controller.api_v1 import fleet_json
from gpuhealth.controller.fleet import Fleet
from gpuhealth.controller.fleet_view import build_fleet_view
from gpuhealth.controller.kube.node_view import NodeView
from gpuhealth.controller.policy import Keys
from gpuhealth.controller.status_cli import render_table
from gpuhealth.controller.status_page.page import StatusPage
from gpuhealth.protocol import Condition, Event, GpuInfo, GpuStatus, Hello, Snapshot

NODES = 5000
GPUS = 8
ROUNDS = 7
OVERVIEW_RATIO = 30.0
"""Target: building the overview costs at most this many encodings of the same document
(about 1.5 times the 18-29 measured on the 2-core reference machine)."""
PREFIX = "gpuhealth.io"
XID79 = Condition(reason="XidError", code="xid-79", severity="unhealthy", action="RESTART_BM")


def _fleet() -> tuple[Fleet, list[NodeView]]:
    fleet = Fleet(clock=FakeClock())
    now = datetime.now(UTC)
    views = []
    for n in range(NODES):
        name = f"gpu-node-{n}"
        infos = [GpuInfo(index=i, uuid=f"GPU-{n}-{i}", model="H100") for i in range(GPUS)]
        fleet.on_connect(
            name, Hello(seq=1, node=name, stream_id="s", boot_id="b", agent_version="b", gpus=infos)
        )
        snap = Snapshot(
            seq=2, node=name, taken_at=now, gpus=[GpuStatus(info=g, state="healthy") for g in infos]
        )
        fleet.on_message(name, snap)
        taints: tuple[dict[str, str], ...] = ()
        if n % 12 == 0:  # ~1 % of GPUs
            fleet.on_message(
                name,
                Event(seq=3, node=name, at=now, kind="transition", gpu_uuid=f"GPU-{n}-3",
                      gpu_index=3, previous="healthy", current="unhealthy", conditions=[XID79]),
            )  # fmt: skip
            taints = ({"key": f"{PREFIX}/unhealthy", "value": "xid-79", "effect": "NoSchedule"},)
        views.append(NodeView(name=name, resource_version="1", taints=taints, gpus=GPUS))
    return fleet, views


class _Views:
    def __init__(self, views: list[NodeView]) -> None:
        self._views = views
        self._by_name = {v.name: v for v in views}

    def views(self) -> list[NodeView]:
        return self._views

    def get(self, name: str) -> NodeView | None:
        return self._by_name.get(name)

    def subscribe(self, listener: Any) -> None:
        pass


def _times_ms(fn: Any) -> list[float]:
    times = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return times


def _overview_vs_encode(page: StatusPage) -> list[float]:
    """Per round: building and encoding the overview, over encoding the finished document
    alone (the same bytes out), timed back to back."""
    doc = page.overview()
    ratios = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        page.overview_json()
        t1 = time.perf_counter()
        msgspec.json.encode(doc)
        t2 = time.perf_counter()
        ratios.append((t1 - t0) / (t2 - t1))
    return ratios


async def run() -> dict[str, list[float]]:
    fleet, views = _fleet()
    page = StatusPage(fleet=fleet, prefix=PREFIX, nodes=_Views(views), cache_s=0.0)
    overview_ms = _times_ms(page.overview_json)
    overview_ratio = _overview_vs_encode(page)
    view = build_fleet_view(fleet, views, Keys(PREFIX))
    fleet_doc = fleet_json(
        view, {}, now=datetime.now(UTC), now_mono=0.0, leader=True, dry_run=False
    )
    table_ms = _times_ms(lambda: render_table(fleet_doc))
    return {
        "overview_ms_p50": overview_ms,
        "overview_vs_encode": overview_ratio,
        "status_table_ms_p50": table_ms,
    }


BENCHMARKS = [
    Benchmark(
        name="web_overview_5000_nodes",
        targets=(
            Target("overview_ms_p50", "ms", 500, "<="),
            Target("overview_vs_encode", "x", OVERVIEW_RATIO, "<="),
            Target("status_table_ms_p50", "ms", 500, "<="),
        ),
        run=run,
        repeats=1,
    ),
]
