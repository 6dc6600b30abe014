"""Runs the demo: control plane, nodes, agents, controller; watches, checks, stops everything.

Every process is a child in its own session and is stopped on the way out, whatever the way
out is (the scenario settled, the deadline passed, an error, SIGINT or SIGTERM).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

from demo import checks as chk
from demo import cluster, karpenter, probes, realnode, remediation, timeline
from demo.kubelet import DemoKubelets, allocations_for
from demo.plan import KARPENTER_POOL, PREFIX, build_plan
from demo.procs import Launched, start_agent, start_controller, stop_all, wait_http
from demo.state import DemoRun, DemoSettings
from demo.view import redraw, render, summary
from gpuhealth.common.errors import GpuHealthError
from gpuhealth.controller.kube.client import make_api_client
from localkube import ControlPlane, assets_dir
from localkube.node import Node
from localkube.objects import wait_for
from localkube.process import ManagedProcess

IDLE_ANNOTATION = f"{PREFIX}/idle-since"
DO_NOT_DISRUPT = karpenter.DO_NOT_DISRUPT
EXIT_OK = 0
EXIT_FAILED = 1
"""An expected taint, untaint or idle flag did not happen (or an unexpected one did)."""
EXIT_ERROR = 2
"""The demo could not run (a component failed to start or died)."""


class DemoError(GpuHealthError):
    """A demo process died or could not be reached."""


@dataclass
class _Wiring:
    """The live connections the watch loop reads through."""

    api: Any
    http: aiohttp.ClientSession
    controller: Launched
    kubelets: DemoKubelets
    procs: list[ManagedProcess]
    agents: dict[str, Launched]


async def _poll(run: DemoRun, w: _Wiring) -> None:
    api, http, controller, kubelets = w.api, w.http, w.controller, w.kubelets
    raw_taints = await cluster.node_taints(api)
    run.obs.observe_nodes({n: raw_taints.get(n, []) for n in run.plan.nodes})
    taints = timeline.our_taints(raw_taints, PREFIX)
    for line in timeline.taint_changes(run.taints, taints):
        run.say(line)
    run.taints = taints

    pods = await cluster.workload_pods(api)
    kubelets.set_allocations(allocations_for(pods, run.uuids))
    idle = await cluster.idle_flagged(api, pods, IDLE_ANNOTATION)
    for pod in sorted(idle - run.idle):
        run.say(f"pod {pod} flagged idle (GPUIdle)")
    run.idle |= idle
    run.obs.observe_idle(idle)

    for node in {c.node for c in run.plan.checks if c.kind == "xid_seen"}:
        seen = await probes.agent_xids(http, w.agents[node])
        for xid in sorted(seen - run.obs.xids.get(node, set())):
            run.say(f"{node} agent counted XID {xid} (gpuhealth_gpu_xid_errors_total)")
        run.obs.observe_xids(node, seen)

    run.episodes = await remediation.episodes(api)
    for line in remediation.phase_changes(run.episode_phases, run.episodes):
        run.say(line)
    for line in remediation.replacement_changes(run.replacements, run.episodes):
        run.say(line)
    run.obs.remediated |= remediation.returned_nodes(run.episodes)
    run.obs.replaced |= remediation.replaced_nodes(run.episodes)
    guarded(run, await cluster.annotated_nodes(api, DO_NOT_DISRUPT, "true"))

    fleet = await probes.get_json(http, controller.url + "/api/v1/fleet")
    gpus = timeline.gpu_states(fleet)
    for line in timeline.gpu_changes(run.gpus, gpus):
        run.say(line)
    run.gpus = gpus
    run.node_state = {str(n.get("name")): str(n.get("state")) for n in fleet.get("nodes", [])}
    for line in run.obs.observe_incidents(fleet.get("incidents") or []):
        run.say(line)


def _taints_changed(run: DemoRun, node: str, raw: list[dict[str, Any]]) -> None:
    """The node watch saw ``node``'s taints change: record and report it at once."""
    if node not in run.plan.nodes:
        return
    run.obs.observe_node(node, raw)
    now = timeline.our_taints({node: raw}, PREFIX)
    for line in timeline.taint_changes({node: run.taints.get(node, [])}, now):
        run.say(line)
    run.taints[node] = now[node]


async def _watch(run: DemoRun, w: _Wiring) -> None:
    node_watch = asyncio.create_task(
        cluster.watch_node_taints(w.api, lambda n, raw: _taints_changed(run, n, raw)),
        name="demo-node-watch",
    )
    try:
        await _watch_loop(run, w)
    finally:
        node_watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await node_watch


async def _watch_loop(run: DemoRun, w: _Wiring) -> None:
    s = run.settings
    assert run.agents_at is not None
    settled_at: float | None = None
    seen: dict[str, str] = {}
    while True:
        for p in w.procs:
            code = p.exited()
            if code is not None:
                raise DemoError(f"{p.name} exited with code {code}:\n{p.log_tail(15)}")
        try:
            await _poll(run, w)
        except (aiohttp.ClientError, TimeoutError, ApiException) as exc:
            run.say(f"poll failed, retrying: {type(exc).__name__}: {exc}")
        for c in run.plan.checks:
            status = chk.evaluate(c, run.obs)
            if status in ("pass", "fail") and seen.get(c.title) != status:
                run.say(f"check {'passed' if status == 'pass' else 'FAILED'}: {c.title}")
            seen[c.title] = status
        now = time.monotonic()
        if settled_at is None and chk.settled(run.plan.checks, run.obs):
            settled_at = now
            run.set_phase(f"all checks passed; stopping in {s.linger_s:.0f}s (Ctrl-C to stop now)")
        run.draw()
        if settled_at is not None and now - settled_at >= s.linger_s:
            return
        if now - run.agents_at > s.deadline_s:
            run.say(f"deadline of {s.deadline_s:.0f}s passed")
            return
        await asyncio.sleep(s.poll_interval_s)


async def run_demo(settings: DemoSettings, out: TextIO = sys.stdout) -> int:
    """The whole demo; returns the exit status (0 when every check passed)."""
    tty = out.isatty() if settings.tty is None else settings.tty
    plan = build_plan(
        settings.nodes,
        settings.gpus,
        idle_window_s=settings.timings.idle_window_s,
        clean_window_s=settings.timings.clean_window_s,
    )
    run = DemoRun(settings, plan, out, tty)
    root = settings.workdir or Path(tempfile.mkdtemp(prefix="gpuhealth-demo-"))
    root.mkdir(parents=True, exist_ok=True)
    procs: list[ManagedProcess] = []
    error: str | None = None
    interrupted = False
    try:
        async with contextlib.AsyncExitStack() as stack:
            await _run(run, stack, root, procs)
    except GpuHealthError as exc:
        error = str(exc)
    except asyncio.CancelledError:
        interrupted = True
        raise
    finally:
        await stop_all(procs, settings.timings.stop_grace_s)
        results = chk.final(plan.checks, run.obs)
        ok = error is None and all(passed for _, passed in results)
        # Keep the logs of a failed run; an interrupted one leaves nothing behind.
        keep = settings.keep or settings.workdir is not None or (not ok and not interrupted)
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    run.phase = "finished" if error is None else "stopped by an error"
    colour = tty
    frame = render(run.frame(), colour=colour, checks=False)
    out.write((redraw(frame) if tty else "\n".join(frame) + "\n") + "\n")
    if run.episodes:
        out.write("remediation episodes (time after the fault was detected):\n")
        out.write("".join(f"  {line}\n" for line in remediation.timeline_lines(run.episodes)))
        out.write("\n")
    if run.status_cli is not None:
        code, text = run.status_cli
        out.write(f"$ gpuhealth-controller status   (exit {code}: 1 = some node unhealthy)\n")
        out.write(text + "\n\n")
    if error is not None:
        out.write(f"ERROR: {error}\n")
    out.write("\n".join(summary([(c.title, p) for c, p in results], run.elapsed(), colour)) + "\n")
    if keep:
        out.write(f"logs and configuration: {root}\n")
    out.flush()
    if error is not None:
        return EXIT_ERROR
    return EXIT_OK if ok else EXIT_FAILED


async def _start_cluster(
    run: DemoRun, stack: contextlib.AsyncExitStack, root: Path
) -> tuple[ControlPlane, Node | None]:
    """The control plane, kube-scheduler and kwok; with ``--real-node`` the node harness
    (which brings the control plane and the scheduler) and its real node as well."""
    s, plan = run.settings, run.plan
    node = None
    if s.real_node:
        real = plan.nodes[0]
        run.set_phase(f"starting {real} as a real node: control plane, containerd, kubelet")
        node = await realnode.start(stack, root, real, plan.scenarios[real])
        cp = realnode.control_plane(node)
        run.say(
            f"real node {real} Ready in {node.ready_seconds.get('node', 0):.1f}s "
            f"({len(node.gpu_uuids)} GPUs from the device plugin); API server at {cp.url}"
        )
        run.set_phase("starting kwok")
    else:
        run.set_phase("starting etcd + kube-apiserver")
        cp = await stack.enter_async_context(ControlPlane(assets_dir(), workdir=root / "kube"))
        run.say(f"control plane ready in {cp.startup_seconds:.1f}s at {cp.url}")
        run.set_phase("starting kube-scheduler and kwok")
        await stack.enter_async_context(cp.scheduler())
    await stack.enter_async_context(cp.kwok())
    return cp, node


def guarded(run: DemoRun, nodes: set[str]) -> None:
    """Nodes seen carrying ``karpenter.sh/do-not-disrupt`` (each said once)."""
    for node in sorted((nodes & set(run.plan.nodes)) - run.obs.guarded):
        run.say(f"{node} kept from the autoscalers ({DO_NOT_DISRUPT}, scale-down-disabled)")
    run.obs.guarded |= nodes


async def _karpenter(
    run: DemoRun, stack: contextlib.AsyncExitStack, api: Any, nodes: list[str]
) -> None:
    """The Karpenter NodePool's nodes, each with its NodeClaim, and Karpenter's stand-in that
    replaces a node whose NodeClaim gpuhealth deleted."""
    if not nodes:
        return
    await karpenter.install(api, KARPENTER_POOL)
    claims = {
        await karpenter.launch(api, n, KARPENTER_POOL, run.plan.gpus_per_node): n for n in nodes
    }
    run.say(f"Karpenter NodePool {KARPENTER_POOL}: {', '.join(nodes)} (NodeClaims, no controller)")
    stand_in = karpenter.KarpenterStandIn(
        api,
        KARPENTER_POOL,
        run.plan.gpus_per_node,
        claims,
        run.say,
        guarded=lambda node: guarded(run, {node}),
    )
    task = asyncio.create_task(stand_in.run(), name="demo-karpenter")

    async def stop() -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    stack.push_async_callback(stop)


async def _run(
    run: DemoRun, stack: contextlib.AsyncExitStack, root: Path, procs: list[ManagedProcess]
) -> None:
    s, plan = run.settings, run.plan
    cp, node = await _start_cluster(run, stack, root)
    real = node.name if node is not None else None
    api = await make_api_client(str(cp.kubeconfig))
    stack.push_async_callback(api.close)
    http = await stack.enter_async_context(
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=s.http_timeout_s))
    )
    fake = tuple(n for n in plan.nodes if n != real)
    run.set_phase(f"creating {len(fake)} kwok GPU nodes x {plan.gpus_per_node} GPUs")
    await cluster.create_nodes(
        api, [n for n in fake if n not in plan.karpenter], plan.gpus_per_node
    )
    await _karpenter(run, stack, api, [n for n in fake if n in plan.karpenter])
    # GPU nodes nobody runs an agent on: the controller reports them after its grace.
    await cluster.create_nodes(api, plan.unwatched, plan.gpus_per_node)
    images = {real: node.pause_name} if real is not None and node is not None else {}
    tokens = cluster.write_tokens(
        await cluster.agent_tokens(api, plan.nodes, images), root / "tokens"
    )
    run.say("agent pods bound to their nodes; bound ServiceAccount tokens issued (TokenRequest)")
    kubelets = DemoKubelets(root / "kubelet", fake)
    await kubelets.start()
    stack.push_async_callback(kubelets.stop)
    # Unwound before the control plane stops: agents and controller go first.
    stack.push_async_callback(stop_all, procs, s.timings.stop_grace_s)

    await remediation.install_crd(api)
    run.set_phase("starting gpuhealth-controller")
    controller = start_controller(root, cp.kubeconfig, s.timings)
    procs.append(controller.proc)
    await wait_http(controller, "/readyz", s.controller_ready_s)
    run.status_url = controller.url + "/"
    run.say(f"controller leading; status page {run.status_url}")
    async with http.get(run.status_url) as resp:
        if resp.status != 200:
            run.status_url += f" (not served by this controller: HTTP {resp.status})"
            run.say(f"the controller does not serve the status page (HTTP {resp.status})")
    await cluster.create_workloads(api, plan.pods)
    # The kubelet stand-ins know the pods' GPUs before the agents start, so that the agents'
    # first snapshot already carries the allocations (as on a node that has been up a while).
    for name in plan.nodes:
        run.uuids[name] = probes.sim_uuids(plan.scenarios[name])
        if name in fake:
            kubelets.set_allocatable(name, list(run.uuids[name].values()))
    if real is not None and node is not None and node.gpu_uuids != list(run.uuids[real].values()):
        raise DemoError(f"the device plugin registered {node.gpu_uuids} on {real}")
    pods = await wait_for(
        lambda: probes.running_pods(api, len(plan.pods)), what="workload pods Running", timeout_s=60
    )
    kubelets.set_allocations(allocations_for(pods, run.uuids))
    run.say(f"pods {', '.join(p.name for p in plan.pods)} scheduled and Running")

    run.set_phase(f"starting {len(plan.nodes)} simulated agents")
    agents = [
        start_agent(
            root,
            name,
            scenario=plan.scenarios[name],
            token_file=tokens[name],
            controller_url=controller.url,
            podresources_socket=(
                realnode.podresources_socket(node)
                if name == real and node
                else kubelets.socket(name)
            ),
            timings=s.timings,
        )
        for name in plan.nodes
    ]
    procs.extend(a.proc for a in agents)
    run.agents_at = time.monotonic()
    await asyncio.gather(*(wait_http(a, "/healthz", s.agent_ready_s) for a in agents))
    for a in agents:
        reported = await probes.agent_uuids(http, a)
        if reported != run.uuids[a.name]:
            raise DemoError(f"agent {a.name} reports GPUs {reported}, expected {run.uuids[a.name]}")
    run.set_phase("scenario running: faults are injected over the next minute")
    await _watch(run, _Wiring(api, http, controller, kubelets, procs, {a.name: a for a in agents}))
    run.status_cli = await probes.status_cli(controller.url, s.http_timeout_s)
