"""What the demo plays and what it must see: per-node simulator scenarios, pods and checks.

Pure data. Times are seconds after the agents start. Every node gets its own scenario and
seed; the faults are spread over nodes so each verdict shows up as its own taint.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

PREFIX = "gpuhealth.io"
UNHEALTHY_KEY = f"{PREFIX}/unhealthy"
DEGRADED_KEY = f"{PREFIX}/degraded"
DOMAIN_KEY = f"{PREFIX}/nvlink-domain"
NVL_DOMAIN = "5f0c7e1a-2b3c-4d5e-8f90-a1b2c3d4e5f6.7"
"""The NVLink domain (``<clusterUUID>.<cliqueId>``) the demo's last three nodes share."""
MODEL = "NVIDIA H100 80GB HBM3"
WORKLOAD_NAMESPACE = "ml-team"
IDLE_POD = "idle-notebook"
BUSY_POD = "training-job"
JOB_NAME = "llm-pretrain"
"""A Job spread over two nodes that crashes (XID 13 on both): one job incident, no taint."""
RAIL_NIC = "mlx5_1"
"""The InfiniBand NIC of the idle node behind GPUs 4-7 (the Job's GPU 4 among them): it flaps
while the Job crashes, and the job incident names it."""
FLAKY_JOB = "flaky-finetune"
"""A one-GPU Job whose GPU faults first on each of its three attempts: the GPU is blamed."""
XID13_LINE = "Graphics SM Warp Exception on (GPC 2, TPC 1, SM 0): Illegal Instruction Encoding"
DEVICE_ANNOTATION = "demo.gpuhealth.io/gpu-indices"
"""Which GPUs the demo's stand-in kubelet hands a pod (comma-separated indices)."""
KARPENTER_POOL = "gpu-spot"
"""The Karpenter NodePool of the demo's last node, whose escalated nodes gpuhealth replaces."""

CheckKind = Literal[
    "tainted",
    "untainted_after",
    "never_tainted",
    "idle",
    "not_idle",
    "xid_seen",
    "remediated",
    "job_incident",
    "gpu_blamed",
    "unwatched",
    "replaced",
]


@dataclass(frozen=True, slots=True)
class Check:
    """One thing the demo verifies against the API server."""

    kind: CheckKind
    node: str = ""
    taint_key: str = ""
    effect: str = ""
    pod: str = ""
    xid: int = 0
    title: str = ""
    job: str = ""
    """``job_incident``: the Job (in the workload namespace) the incident must name."""
    rail: str = ""
    """``job_incident``: the rail (``node/device/port``) it must name too ("": none asked)."""


@dataclass(frozen=True, slots=True)
class PodPlan:
    name: str
    node: str
    gpu_indices: tuple[int, ...]
    job: str = ""
    """The batch/v1 Job that owns the pod ("": a lone pod)."""


@dataclass(frozen=True, slots=True)
class DemoPlan:
    nodes: tuple[str, ...]
    gpus_per_node: int
    scenarios: dict[str, dict[str, Any]]
    """Node -> simulator scenario (the YAML document as a dict)."""
    pods: tuple[PodPlan, ...]
    checks: tuple[Check, ...]
    idle_window_s: float
    clean_window_s: float
    notes: dict[str, str] = field(default_factory=dict)
    """Node -> one line for the terminal view (what happens there)."""
    unwatched: tuple[str, ...] = ()
    """GPU nodes created without an agent: reported as unwatched."""
    karpenter: tuple[str, ...] = ()
    """Nodes of the Karpenter NodePool :data:`KARPENTER_POOL` (each with its NodeClaim)."""


def node_name(i: int) -> str:
    return f"gpu-node-{i}"


def build_plan(
    nodes: int = 9, gpus: int = 8, idle_window_s: float = 20.0, clean_window_s: float = 15.0
) -> DemoPlan:
    """The default story on ``nodes`` nodes (at least 5) of ``gpus`` GPUs (at least 7); the
    replacement of an escalated Karpenter node needs a ninth."""
    if nodes < 5 or gpus < 7:
        raise ValueError("the demo needs at least 5 nodes of 7 GPUs")
    names = tuple(node_name(i) for i in range(nodes))
    lonely = node_name(nodes)  # created without an agent
    xid79, dbe, hot, app, idle = names[:5]
    base = {"gpus": gpus, "model": MODEL, "poll_interval_s": 1.0}
    faults: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    faults[xid79] = [
        {"at": 10, "gpu": 3, "xid": 79, "message": "GPU has fallen off the bus."},
        {"at": 11, "gpu": 3, "lost": True},
    ]
    faults[dbe] = [
        {"at": 14, "gpu": 5, "dbe": 1},
        {
            "at": 14,
            "gpu": 5,
            "xid": 48,
            "message": "An uncorrectable double bit error (DBE) has been detected on GPU.",
        },
    ]  # no reset here: the controller's remediation loop orders it
    faults[hot] = [{"at": 18, "gpu": 2, "temperature": 90.5, "for": 15}]
    # Job FLAKY_JOB on hot's GPU 6 restarts every 8 s; the GPU faults first each time.
    faults[hot] += [
        {"at": at, "gpu": 6, "xid": 13, "pid": 5151, "process": "python3", "message": XID13_LINE}
        for at in (6, 14, 22)
    ]
    faults[app] = [
        {
            "at": 8,
            "gpu": 1,
            "xid": 13,
            "pid": 4242,
            "process": "python3",
            "message": "Graphics Exception: ESR 0x514648=0x1000000e",
        }
    ]
    faults[idle] = [{"at": 0, "gpu": 6, "utilization": 0.0, "for": 3600}]
    # The Job on app's GPU 1 and idle's GPU 4 crashes at t+8 on both nodes: XID 13, then 43.
    faults[app].append({"at": 9, "gpu": 1, "xid": 43})
    faults[idle] += [
        {"at": 8, "gpu": 4, "xid": 13, "message": "Graphics Exception: ESR 0x514648=0x1000000e"},
        {"at": 9, "gpu": 4, "xid": 43},
        # ... while the InfiniBand rail behind that GPU flaps (the network's fault: the job
        # incident names the rail, GPU 4 is not blamed; GPUs 4-7 degraded, PreferNoSchedule)
        {"at": 4, "nic": RAIL_NIC, "rail_flap": 3, "for": 6},
    ]
    nics = {
        idle: [
            {"device": "mlx5_0", "gpus": list(range(4))},
            {"device": RAIL_NIC, "gpus": list(range(4, gpus))},
        ]
    }
    rail = f"{idle}/{RAIL_NIC}/1"
    rack = names[5:8] if nodes >= 8 else ()
    for n in rack[1:]:  # the shared fabric degrades on two trays at once
        faults[n] = [{"at": 22, "gpu": 0, "fabric_health": ["route-unhealthy"], "for": 20}]
    # A GPU Operational Event with no legacy Xid (power-smoothing lifetime exhausted), on a
    # driver release that does not publish its code: judged by its category (POWER_ERROR).
    goe = names[5] if nodes > 5 else None  # also the rack's first tray: other taint keys
    if goe is not None:
        faults[goe] = [{"at": 12, "gpu": 4, "operational_event": "GPU-PSHC 0x0004 severity=FATAL"}]
    # A Karpenter node's GPU fails its row remap (CONTACT_SUPPORT): the episode escalates (RMA)
    # and, its NodePool allowing it, gpuhealth deletes its NodeClaim: the node is replaced.
    spot = names[8] if nodes > 8 else None
    if spot is not None:
        faults[spot] = [{"at": 16, "gpu": 2, "row_remap": "failure"}]
    scenarios = {
        n: {
            "name": f"demo-{n}",
            **base,
            "seed": 1000 + i,
            "events": faults[n],
            **({"fabric": NVL_DOMAIN} if n in rack else {}),
            **({"nics": nics[n]} if n in nics else {}),
        }
        for i, n in enumerate(names)
    }
    checks = (
        Check("tainted", xid79, UNHEALTHY_KEY, "NoSchedule",
              title=f"{xid79}: XID 79 (fallen off the bus) -> NoSchedule taint"),
        Check("tainted", dbe, UNHEALTHY_KEY, "NoSchedule",
              title=f"{dbe}: double-bit ECC -> NoSchedule taint"),
        Check("remediated", dbe,
              title=f"{dbe}: remediation quarantine -> drain -> GPU reset -> validate -> Returned"),
        Check("untainted_after", dbe, UNHEALTHY_KEY, "NoSchedule",
              title=f"{dbe}: GPU reset by the loop -> taint removed (recovery)"),
        Check("tainted", hot, DEGRADED_KEY, "PreferNoSchedule",
              title=f"{hot}: running hot -> PreferNoSchedule taint"),
        Check("gpu_blamed", hot,
              title=f"{hot}: GPU 6 faults first in 3 attempts of Job {FLAKY_JOB} -> GPU blamed"),
        Check("tainted", hot, UNHEALTHY_KEY, "NoSchedule",
              title=f"{hot}: the blamed GPU -> NoSchedule taint (gpu-blamed)"),
        Check("untainted_after", hot, DEGRADED_KEY, "PreferNoSchedule",
              title=f"{hot}: cooled down -> taint removed after the clean window"),
        Check("xid_seen", app, xid=13, title=f"{app}: XID 13 reached the agent (its metrics)"),
        Check("never_tainted", app, title=f"{app}: XID 13 (application fault) -> NOT tainted"),
        Check("job_incident", job=JOB_NAME, rail=rail,
              title=f"Job {JOB_NAME} crashed on {app} and {idle} while rail {rail} flapped -> "
              "one job incident naming the rail, no taint"),
        Check("never_tainted", idle, effect="NoSchedule",
              title=f"{idle}: the job's crash -> GPU 4 NOT blamed, never NoSchedule"),
        Check("tainted", idle, DEGRADED_KEY, "PreferNoSchedule",
              title=f"{idle}: rail {RAIL_NIC} flapping -> PreferNoSchedule (rail-flapping)"),
        Check("idle", idle, pod=IDLE_POD,
              title=f"{idle}: pod {WORKLOAD_NAMESPACE}/{IDLE_POD} holds a GPU idle -> flagged"),
        Check("not_idle", idle, pod=BUSY_POD,
              title=f"{idle}: busy pod {WORKLOAD_NAMESPACE}/{BUSY_POD} -> not flagged"),
        *(
            (Check("tainted", goe, DEGRADED_KEY, "PreferNoSchedule",
                   title=f"{goe}: operational event without an Xid, by category -> "
                   "PreferNoSchedule taint"),)
            if goe is not None else ()
        ),
        *(Check("tainted", n, DOMAIN_KEY, "NoSchedule",
                title=f"{n}: NVLink domain incident (fabric degraded on 2 trays) -> domain taint")
          for n in rack),
        *(Check("untainted_after", n, DOMAIN_KEY, "NoSchedule",
                title=f"{n}: fabric healthy again -> domain incident closed, taint removed")
          for n in rack[:1]),
        *(
            (Check("tainted", spot, UNHEALTHY_KEY, "NoSchedule",
                   title=f"{spot}: row-remap failure -> NoSchedule taint"),
             Check("replaced", spot,
                   title=f"{spot}: escalated (RMA), kept from the autoscaler "
                   "(karpenter.sh/do-not-disrupt), its NodeClaim deleted -> replaced; the "
                   "GPURemediation keeps the record"))
            if spot is not None else ()
        ),
        *(Check("never_tainted", n, title=f"{n}: healthy -> never tainted")
          for n in names[5:] if n not in rack and n not in (goe, spot)),
        Check("unwatched", lonely,
              title=f"{lonely}: a GPU node with no agent -> reported unwatched"),
    )  # fmt: skip
    notes = {
        xid79: "t+10s GPU 3 XID 79 (fallen off the bus)",
        dbe: "t+14s GPU 5 double-bit ECC; the remediation loop resets it",
        hot: f"t+18s GPU 2 at 90.5 C for 15 s; GPU 6 XID 13 on each attempt of Job {FLAKY_JOB}",
        app: f"t+8s GPU 1 XID 13: Job {JOB_NAME} crashes (application fault)",
        idle: f"pod {IDLE_POD} holds GPU 6 at ~0 % utilisation; t+4s rail {RAIL_NIC} (GPUs 4-7) "
        f"flaps; t+8s Job {JOB_NAME} crashes",
        **{n: "NVL72 tray, healthy; its domain's fabric degrades at t+22s" for n in rack[:1]},
        **{n: "NVL72 tray: t+22s fabric route-unhealthy for 20 s" for n in rack[1:]},
    }
    if spot is not None:
        notes[spot] = f"Karpenter NodePool {KARPENTER_POOL}: t+16s GPU 2 row-remap failure"
    if goe is not None:
        notes[goe] = "; ".join(
            x
            for x in (
                "t+12s GPU 4 operational event GPU-PSHC 0x0004 (no Xid): by category",
                notes.get(goe),
            )
            if x
        )
    pods = (
        PodPlan(IDLE_POD, idle, (6,)),
        PodPlan(BUSY_POD, idle, (0, 1, 2, 3)),
        PodPlan(f"{JOB_NAME}-0", app, (1,), job=JOB_NAME),
        PodPlan(f"{JOB_NAME}-1", idle, (4,), job=JOB_NAME),
        PodPlan(f"{FLAKY_JOB}-0", hot, (6,), job=FLAKY_JOB),
    )
    return DemoPlan(
        nodes=names,
        gpus_per_node=gpus,
        scenarios=scenarios,
        pods=pods,
        checks=checks,
        idle_window_s=idle_window_s,
        clean_window_s=clean_window_s,
        notes=notes,
        unwatched=(lonely,),
        karpenter=(spot,) if spot is not None else (),
    )
