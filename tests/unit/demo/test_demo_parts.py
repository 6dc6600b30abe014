"""The demo's pure parts: the plan, the check verdicts, the change lines and the view."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import yaml

from demo import checks as chk
from demo import timeline
from demo.kubelet import PodAllocation, allocations_for
from demo.plan import DEGRADED_KEY, DEVICE_ANNOTATION, UNHEALTHY_KEY, Check, build_plan
from demo.procs import DemoTimings, agent_config, controller_config
from demo.view import Frame, NodeLine, render, summary
from gpuhealth.agent.sources.sim.scenario import parse_scenario

PLAN = build_plan()


def taint(key: str, value: str, effect: str) -> dict[str, str]:
    return {"key": key, "value": value, "effect": effect}


def test_every_node_scenario_is_a_valid_simulator_scenario() -> None:
    assert len(PLAN.nodes) == 9 and PLAN.karpenter == ("gpu-node-8",)
    for node in PLAN.nodes:
        scenario = parse_scenario(yaml.safe_dump(PLAN.scenarios[node]), node)
        assert scenario.gpus == 8
    kinds = {
        e.kind for n in PLAN.nodes for e in parse_scenario(yaml.safe_dump(PLAN.scenarios[n])).faults
    }
    assert {"xid", "dbe", "temperature", "utilization", "lost", "row_remap"} <= kinds
    assert "reset" not in kinds  # the remediation loop resets the double-bit ECC GPU


def test_seeds_differ_per_node() -> None:
    assert len({PLAN.scenarios[n]["seed"] for n in PLAN.nodes}) == len(PLAN.nodes)


def test_plan_needs_enough_nodes() -> None:
    with pytest.raises(ValueError):
        build_plan(nodes=4)


def test_configs_use_known_settings() -> None:
    from gpuhealth.agent.settings import load_config as agent_load
    from gpuhealth.controller.settings import load_config as controller_load

    t = DemoTimings()
    agent_load(None, agent_config(t))  # unknown keys would raise ConfigError
    cfg = controller_load(
        None, controller_config(t, "127.0.0.1:1", __import__("pathlib").Path("k"))
    )
    assert cfg.breaker.max_fraction == t.breaker_max_fraction
    assert cfg.idle.window_s == t.idle_window_s and cfg.idle.annotate


XID = Check("tainted", "n0", UNHEALTHY_KEY, "NoSchedule")
RECOVER = Check("untainted_after", "n0", UNHEALTHY_KEY, "NoSchedule")
HOT = Check("tainted", "n0", DEGRADED_KEY, "PreferNoSchedule")
NEVER = Check("never_tainted", "n1")
IDLE = Check("idle", pod="p")
NOT_IDLE = Check("not_idle", pod="q")
XID13 = Check("xid_seen", "n1", xid=13)


@pytest.mark.parametrize(
    ("polls", "idle", "expected"),
    [
        ([], set(), {XID: "pending", RECOVER: "pending", NEVER: "pending", IDLE: "pending",
                     NOT_IDLE: "holding"}),
        ([{"n0": [], "n1": []}], set(), {XID: "pending", NEVER: "holding"}),
        ([{"n0": [taint(UNHEALTHY_KEY, "xid-79", "NoSchedule")]}], set(),
         {XID: "pass", RECOVER: "pending", HOT: "pending"}),
        ([{"n0": [taint(UNHEALTHY_KEY, "ecc-dbe", "NoSchedule")]}, {"n0": []}], set(),
         {XID: "pass", RECOVER: "pass"}),
        # Removed and back again: not recovered.
        ([{"n0": [taint(UNHEALTHY_KEY, "a", "NoSchedule")]}, {"n0": []},
          {"n0": [taint(UNHEALTHY_KEY, "b", "NoSchedule")]}], set(), {RECOVER: "pending"}),
        # A foreign taint is not ours; the wrong effect does not count.
        ([{"n0": [taint("example.com/x", "", "NoSchedule"),
                  taint(UNHEALTHY_KEY, "x", "NoExecute")], "n1": []}], set(),
         {XID: "pending", NEVER: "holding"}),
        ([{"n1": [taint(DEGRADED_KEY, "thermal", "PreferNoSchedule")]}, {"n1": []}], set(),
         {NEVER: "fail"}),
        ([{"n0": []}], {"p", "q"}, {IDLE: "pass", NOT_IDLE: "fail", XID13: "pending"}),
    ],
)  # fmt: skip
def test_evaluate(polls: list[dict[str, Any]], idle: set[str], expected: dict[Check, str]) -> None:
    obs = chk.Observations()
    for p in polls:
        obs.observe_nodes(p)
    obs.observe_idle(idle)
    assert {c: chk.evaluate(c, obs) for c in expected} == expected


def test_xid_seen() -> None:
    obs = chk.Observations()
    obs.observe_xids("n1", {31})
    assert chk.evaluate(XID13, obs) == "pending"
    obs.observe_xids("n1", {13})
    assert chk.evaluate(XID13, obs) == "pass"


def test_final_turns_pending_into_failure_and_holding_into_pass() -> None:
    obs = chk.Observations()
    obs.observe_nodes({"n0": [], "n1": []})
    assert chk.final([XID, NEVER], obs) == [(XID, False), (NEVER, True)]
    assert not chk.settled([XID, NEVER], obs)
    obs.observe_nodes({"n0": [taint(UNHEALTHY_KEY, "xid-79", "NoSchedule")], "n1": []})
    assert chk.settled([XID, NEVER], obs)


def fleet(states: dict[int, str], conds: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "nodes": [
            {"name": "n0", "gpus": [
                {"index": i, "state": s, "conditions": conds if s != "healthy" else []}
                for i, s in states.items()
            ]}
        ]
    }  # fmt: skip


def test_gpu_changes_name_codes_and_actions() -> None:
    xid = [
        {"code": "xid-79", "action": "RESTART_BM", "message": "fallen off the bus"},
        {"code": "gpu-lost", "action": "RESTART_BM"},
    ]
    before = timeline.gpu_states(fleet({0: "healthy", 1: "healthy"}))
    after = timeline.gpu_states(fleet({0: "healthy", 1: "unhealthy"}, xid))
    assert timeline.gpu_changes(before, after) == [
        "n0 GPU 1 healthy -> unhealthy: xid-79 gpu-lost (RESTART_BM)"
    ]
    assert timeline.gpu_changes(after, after) == []
    assert timeline.gpu_changes({}, before) == []  # first sight of healthy GPUs is no news
    unknown = timeline.gpu_states(fleet({0: "unknown", 1: "unknown"}))
    assert timeline.gpu_changes(unknown, before) == []  # nor GPUs coming up healthy


def test_taint_changes_only_ours() -> None:
    ours = timeline.our_taints(
        {"n0": [taint(UNHEALTHY_KEY, "xid-79", "NoSchedule"), taint("other/x", "", "NoSchedule")]},
        "gpuhealth.io",
    )
    assert ours == {"n0": [f"{UNHEALTHY_KEY}=xid-79:NoSchedule"]}
    assert timeline.taint_changes({}, ours) == [f"n0 tainted {UNHEALTHY_KEY}=xid-79:NoSchedule"]
    assert timeline.taint_changes(ours, {"n0": []}) == [
        f"n0 untainted {UNHEALTHY_KEY}=xid-79:NoSchedule"
    ]


def test_render_plain_has_no_escapes_and_shows_everything() -> None:
    frame = Frame(
        elapsed_s=12.5,
        phase="scenario running",
        status_url="http://127.0.0.1:1/",
        nodes=[
            NodeLine("n0", ["healthy", "unhealthy"], "unhealthy", ["k=v:NoSchedule"], note="xid"),
            NodeLine("n1", ["healthy", "healthy"], "healthy", [], idle_gpus={1}),
            NodeLine("n2", [], "unknown", []),
        ],
        events=["e1", "e2"],
        checks=[("a", "pass"), ("b", "pending"), ("c", "holding"), ("d", "fail")],
    )
    plain = "\n".join(render(frame, colour=False))
    assert "\x1b" not in plain
    assert "●✖" in plain and "●◌" in plain and "(no report yet)" in plain
    assert "k=v:NoSchedule" in plain and "http://127.0.0.1:1/" in plain
    assert "✔ a" in plain and "✘ d" in plain
    assert "\x1b[31m" in "\n".join(render(frame, colour=True))


def test_summary_counts() -> None:
    lines = summary([("a", True), ("b", False)], 61.2, colour=False)
    assert lines[0] == "gpuhealth demo finished after 61s: 1/2 checks passed"
    assert lines[1:] == ["  ✔ a", "  ✘ b"]


def pod(name: str, node: str | None, phase: str, indices: str | None) -> Any:
    from types import SimpleNamespace as NS

    annotations = {DEVICE_ANNOTATION: indices} if indices is not None else None
    return NS(
        metadata=NS(name=name, namespace="ml", annotations=annotations),
        spec=NS(node_name=node, containers=[NS(name="main")]),
        status=NS(phase=phase),
    )


def test_kubelet_reports_running_bound_pods_with_their_gpus() -> None:
    uuids = {"n0": {0: "GPU-a", 1: "GPU-b", 6: "GPU-g"}}
    pods = [
        pod("nb", "n0", "Running", "6"),
        pod("job", "n0", "Running", "0,1"),
        pod("pending", None, "Pending", "0"),
        pod("starting", "n0", "Pending", "1"),
        pod("cpu-only", "n0", "Running", None),
        pod("elsewhere", "n9", "Running", "0"),
    ]
    got = allocations_for(pods, uuids)
    assert got == {
        "n0": [
            PodAllocation("ml", "nb", "main", ("GPU-g",)),
            PodAllocation("ml", "job", "main", ("GPU-a", "GPU-b")),
        ]
    }


def test_sim_uuids_match_what_the_simulator_reports() -> None:
    from demo.probes import sim_uuids

    a = sim_uuids(PLAN.scenarios[PLAN.nodes[0]])
    assert sorted(a) == list(range(8)) and len(set(a.values())) == 8
    assert a == sim_uuids(PLAN.scenarios[PLAN.nodes[0]])
    assert a != sim_uuids(PLAN.scenarios[PLAN.nodes[1]])


def _episode(phase: str, **times: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "gpu-node-1-ep"},
        "spec": {"nodeName": "gpu-node-1", "action": "reset-gpu"},
        "status": {"phase": phase, "reason": "Validated", "times": times},
    }


def test_remediation_episode_lines_and_check() -> None:
    from demo import checks as chk
    from demo import remediation as rem

    times = {
        "detected": "2026-01-01T00:00:00Z",
        "quarantined": "2026-01-01T00:00:00.500000Z",
        "drained": "2026-01-01T00:00:01Z",
        "remediated": "2026-01-01T00:00:02Z",
        "validated": "2026-01-01T00:00:07Z",
    }
    seen: dict[str, str] = {}
    validating = _episode("Validating", **{k: v for k, v in times.items() if k != "validated"})
    assert rem.phase_changes(seen, [validating]) == [
        "gpu-node-1 remediation Validating (reset-gpu: Validated)"
    ]
    assert rem.phase_changes(seen, [validating]) == []  # reported once
    assert rem.returned_nodes([validating]) == set()
    done = _episode("Returned", **times, returned="2026-01-01T00:00:07.250000Z")
    assert rem.phase_changes(seen, [done]) == [
        "gpu-node-1 remediation Returned (reset-gpu: quarantine lifted)"
    ]
    assert rem.timeline_lines([done]) == [
        "gpu-node-1 (reset-gpu): Returned; detected +0.0s → quarantined +0.5s → drained +1.0s"
        " → remediated +2.0s → validated +7.0s → returned +7.2s"
    ]
    assert rem.returned_nodes([done]) == {"gpu-node-1"}
    check = next(c for c in PLAN.checks if c.kind == "remediated")
    obs = chk.Observations()
    assert chk.evaluate(check, obs) == "pending"
    obs.remediated |= rem.returned_nodes([done])
    assert chk.evaluate(check, obs) == "pass"
    assert rem.timeline_lines([{"spec": {}, "status": {"times": {"detected": "bad"}}}]) == [
        "? (?): ?; no stage times"
    ]


def test_a_taint_seen_only_by_the_node_watch_counts() -> None:
    from demo import checks as chk

    check = next(c for c in PLAN.checks if c.kind == "untainted_after" and c.node == "gpu-node-1")
    obs = chk.Observations()
    taint = {"key": "gpuhealth.io/unhealthy", "value": "ecc-dbe", "effect": "NoSchedule"}
    obs.observe_node("gpu-node-1", [taint])
    obs.observe_node("gpu-node-1", [])
    assert obs.polls == 0
    assert chk.evaluate(check, obs) == "pass"


def test_job_incident_check_passes_on_the_controllers_job_incident() -> None:
    from demo.checks import Observations, evaluate
    from demo.plan import JOB_NAME, WORKLOAD_NAMESPACE

    [check] = [c for c in PLAN.checks if c.kind == "job_incident"]
    assert {p.node for p in PLAN.pods if p.job == JOB_NAME} == {"gpu-node-3", "gpu-node-4"}
    obs = Observations()
    assert evaluate(check, obs) == "pending"
    other = {"id": "job-1", "kind": "job", "decision": "no taint", "subjects": {"owner": "x/Job/y"}}
    assert obs.observe_incidents([other]) and evaluate(check, obs) == "pending"
    mine = {
        "id": "job-2",
        "kind": "job",
        "decision": "no taint",
        "reason": "XID 13 on 2 nodes",
        "subjects": {"owner": f"{WORKLOAD_NAMESPACE}/Job/{JOB_NAME}"},
    }
    [line] = obs.observe_incidents([other, mine])
    assert "no taint" in line and evaluate(check, obs) == "pending"  # the rail not named
    assert check.rail == "gpu-node-4/mlx5_1/1"
    named = {**mine, "subjects": {**mine["subjects"], "rails": [check.rail]}}  # type: ignore[dict-item]
    obs.observe_incidents([other, named])
    assert evaluate(check, obs) == "pass"
    assert obs.observe_incidents([other, named]) == []


def test_the_replacement_lines_and_check() -> None:
    """The Karpenter node's check passes once it was seen guarded and its episode's
    replacement completed; each replacement state is told once."""
    from demo import checks as chk
    from demo import remediation as rem

    def escalated(state: str) -> dict[str, object]:
        return {
            "metadata": {"name": "gpu-node-8-ep"},
            "spec": {"nodeName": "gpu-node-8", "action": "escalate"},
            "status": {
                "phase": "Escalated",
                "replacement": {"state": state, "message": f"m-{state}"},
            },
        }

    seen: dict[str, str] = {}
    assert rem.replacement_changes(seen, [escalated("Deleted")]) == [
        "gpu-node-8 replacement Deleted: m-Deleted"
    ]
    assert rem.replacement_changes(seen, [escalated("Deleted")]) == []
    assert rem.replaced_nodes([escalated("Deleted")]) == set()
    assert rem.replaced_nodes([escalated("Completed")]) == {"gpu-node-8"}
    check = next(c for c in PLAN.checks if c.kind == "replaced")
    assert check.node == "gpu-node-8"
    obs = chk.Observations()
    obs.replaced.add("gpu-node-8")
    assert chk.evaluate(check, obs) == "pending"  # never seen guarded
    obs.guarded.add("gpu-node-8")
    assert chk.evaluate(check, obs) == "pass"


def test_the_idle_nodes_rail_flaps_under_the_job_and_only_soft_taints_count() -> None:
    from demo.checks import Observations, evaluate
    from demo.plan import RAIL_NIC

    scenario = PLAN.scenarios["gpu-node-4"]
    assert [n["device"] for n in scenario["nics"]] == ["mlx5_0", RAIL_NIC]
    assert any(e.get("nic") == RAIL_NIC and e.get("rail_flap") for e in scenario["events"])
    [never] = [c for c in PLAN.checks if c.kind == "never_tainted" and c.node == "gpu-node-4"]
    obs = Observations()
    soft = {"key": "gpuhealth.io/degraded", "value": "rail-flapping", "effect": "PreferNoSchedule"}
    obs.observe_nodes({"gpu-node-4": [soft]})
    assert evaluate(never, obs) == "holding"
    hard = {"key": "gpuhealth.io/unhealthy", "value": "gpu-blamed", "effect": "NoSchedule"}
    obs.observe_nodes({"gpu-node-4": [soft, hard]})
    assert evaluate(never, obs) == "fail"


def test_the_demo_shows_a_gpu_blame_and_an_unwatched_node() -> None:
    """The plan's restarting Job on gpu-node-2's GPU 6 faults first on each of three attempts
    (more than attempt_gap_s apart), and gpu-node-9 has no agent; the checks pass on the
    controller's incidents only (a suspicion is not yet a blame)."""
    from demo.checks import Observations, evaluate
    from demo.plan import FLAKY_JOB
    from demo.procs import DemoTimings

    [blamed] = [c for c in PLAN.checks if c.kind == "gpu_blamed"]
    [unwatched] = [c for c in PLAN.checks if c.kind == "unwatched"]
    assert (blamed.node, unwatched.node, PLAN.unwatched) == (
        "gpu-node-2",
        "gpu-node-9",
        ("gpu-node-9",),
    )
    assert unwatched.node not in PLAN.nodes  # no agent is started for it
    [pod] = [p for p in PLAN.pods if p.job == FLAKY_JOB]
    attempts = [e["at"] for e in PLAN.scenarios[pod.node]["events"] if e.get("xid") == 13]
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert (pod.node, pod.gpu_indices, len(attempts)) == ("gpu-node-2", (6,), 3)
    assert min(gaps) > DemoTimings().attempt_gap_s
    obs = Observations()
    suspected = {
        "id": "gpu-1",
        "kind": "gpu",
        "decision": "gpu suspected: degraded (soft taint)",
        "subjects": {"nodes": ["gpu-node-2"]},
    }
    obs.observe_incidents([suspected])
    assert evaluate(blamed, obs) == "pending"
    obs.observe_incidents([{**suspected, "decision": "gpu blamed: unhealthy + diagnostic"}])
    assert evaluate(blamed, obs) == "pass" and evaluate(unwatched, obs) == "pending"
    obs.observe_incidents(
        [{"id": "unwatched-1", "kind": "unwatched", "subjects": {"nodes": ["gpu-node-9"]}}]
    )
    assert evaluate(unwatched, obs) == "pass"
