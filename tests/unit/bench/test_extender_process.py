"""The extender-through-the-process benchmark's own pieces: what its agents send keeps the
in-process comparison honest, every figure it reports has a target, it reads the controller's
metrics right."""

from __future__ import annotations

from bench import bench_extender_process as bench
from bench.bench_placement import fleet_of, node_name
from gpuhealth.controller.placement import PlacementIndex
from gpuhealth.protocol.codec import decode_agent


def test_heartbeats_leave_the_extender_answers_as_in_process() -> None:
    # The controller's fleet also takes the agents' heartbeats; the in-process one does not.
    reports = [(n, *bench._report(n)) for n in range(60)]
    beaten = fleet_of(reports)
    for n, gpus, allocs in reports:
        for seq in (3, 4):
            beaten.on_message(node_name(n), decode_agent(bench._heartbeat(n, seq, gpus, allocs)))
    assert PlacementIndex(beaten).summaries == PlacementIndex(fleet_of(reports)).summaries
    states = {g.state for _, gpus, _ in reports for g in gpus}
    assert {"healthy", "unhealthy"} <= states, "the fleet should have some unhealthy GPUs"


def test_every_figure_has_a_target() -> None:
    metrics = {t.metric for b in bench.BENCHMARKS for t in b.targets}
    reported = {
        f"extender_{where}_{verb}_{stat}_ms_{n}"
        for where in ("process", "inprocess")
        for verb in bench.VERBS
        for stat in ("p50", "p99")
        for n in bench.NODE_COUNTS
    } | {f"extender_process_{v}_vs_inprocess_{n}" for v in bench.VERBS for n in bench.NODE_COUNTS}
    assert metrics == reported


def test_metric_samples() -> None:
    text = "\n".join(
        [
            "# HELP gpuhealth_nodes Nodes by worst GPU state",
            'gpuhealth_nodes{state="healthy"} 4990.0',
            'gpuhealth_nodes{state="unknown"} 10.0',
            "gpuhealth_controller_connected_agents 5000.0",
            'gpuhealth_reconcile_total{result="ok"} 1.2e+04',
            'gpuhealth_node_agent_connected{node="gpu-node-00001"} 1.0',
        ]
    )
    found = {m[1] + (m[2] or ""): float(m[3]) for m in bench._SAMPLE.finditer(text)}
    assert found['gpuhealth_nodes{state="unknown"}'] == 10.0
    assert found["gpuhealth_controller_connected_agents"] == 5000.0
    assert found['gpuhealth_reconcile_total{result="ok"}'] == 12000.0
