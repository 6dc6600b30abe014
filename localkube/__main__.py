"""``python -m localkube``: run a local control plane until Ctrl-C (for poking at by hand);
with ``--real-node``, a real single-node cluster (root; see localkube.node)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from pathlib import Path

from kubernetes_asyncio import client, config

from localkube.controlplane import ControlPlane
from localkube.node import Node, NodeSettings
from localkube.objects import create_gpu_node


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m localkube", description=__doc__)
    parser.add_argument("--scheduler", action="store_true", help="also run kube-scheduler")
    parser.add_argument("--kwok", action="store_true", help="also run kwok")
    parser.add_argument("--gpu-nodes", type=int, default=0, help="fake GPU nodes to create")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument(
        "--duration", type=float, default=None, help="seconds to stay up (default: until Ctrl-C)"
    )
    real = parser.add_argument_group("a real node (root): containerd, kubelet, kube-proxy, ...")
    real.add_argument("--real-node", action="store_true", help="run localkube.node.Node")
    real.add_argument(
        "--image", type=Path, action="append", default=[], help="OCI archive to import (repeat)"
    )
    real.add_argument("--sim-scenario", type=Path, help="the agent's scenario (GPU UUIDs)")
    real.add_argument("--sim-seed", type=int, default=0, help="the agent's --sim-seed")
    return parser.parse_args(argv)


async def _create_nodes(cp: ControlPlane, count: int, gpus: int) -> None:
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(cp.kubeconfig), client_configuration=cfg)
    async with client.ApiClient(configuration=cfg) as api:
        for i in range(count):
            await create_gpu_node(api, f"gpu-node-{i}", gpus=gpus)


async def run(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    async with contextlib.AsyncExitStack() as stack:
        if args.real_node:
            settings = NodeSettings(
                images=tuple(args.image), sim_scenario=args.sim_scenario, sim_seed=args.sim_seed
            )
            node = await stack.enter_async_context(Node(settings=settings, log=print))
            assert node.control_plane is not None
            cp = node.control_plane
            print(f"node {node.name} ready; GPUs {' '.join(node.gpu_uuids)}; images {node.images}")
        else:
            cp = await stack.enter_async_context(ControlPlane())
            print(f"control plane ready in {cp.startup_seconds:.2f}s at {cp.url}")
        if args.scheduler and not args.real_node:
            await stack.enter_async_context(cp.scheduler())
            print("kube-scheduler ready")
        if args.kwok:
            await stack.enter_async_context(cp.kwok())
            print("kwok ready")
        await _create_nodes(cp, args.gpu_nodes, args.gpus_per_node)
        print(f"export KUBECONFIG={cp.kubeconfig}", flush=True)
        # SIGTERM would otherwise end Python without unwinding, orphaning the children.
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=args.duration)


def main(argv: list[str] | None = None) -> None:
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run(argv))


if __name__ == "__main__":
    main()
