"""``gpuhealth-agent``: the node agent's command line.

A contract (docs/architecture.md "Contracts"): flags, operator commands, exit codes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from typing import Any

import msgspec
import yaml

from gpuhealth.agent import __version__
from gpuhealth.agent.settings import AgentSettings, load_config
from gpuhealth.common import logging as glog
from gpuhealth.common.errors import ConfigError, GpuHealthError

_EPILOG = """\
Every setting can also be given in the --config YAML file under the same name with
underscores (node_name, sim_scenario, ...), plus the nested sections health, nvml, kmsg,
dcgm, rdma, podresources and stream that hold every threshold, interval and timeout; flags
override the file. --print-config shows the effective configuration with every default.

Endpoints on --listen: /metrics (Prometheus), /healthz, /readyz, /api/v1/status (JSON).

Operator commands, on the running agent's admin socket (<state-dir>/admin.sock, mode
0600; run them in the agent pod with kubectl exec):
  gpuhealth-agent clear --gpu UUID|INDEX|all [--reason TEXT] [--state-dir DIR]
      clear the verdict on a GPU repaired in a way the agent cannot see
  gpuhealth-agent status [--json] [--state-dir DIR]
      each GPU's state and conditions
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpuhealth-agent",
        description="GPU node health agent: watches NVML (or dcgm-exporter, or a simulator)\n"
        "and the kernel log, decides each GPU's health, exports Prometheus metrics and\n"
        "streams health events to the gpuhealth controller.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = p.add_argument
    add("--config", metavar="FILE", help="YAML configuration file (flags override it)")
    add(
        "--node-name",
        metavar="NAME",
        help="Kubernetes node this agent speaks for (default: $NODE_NAME, else the hostname)",
    )
    add(
        "--source",
        choices=["nvml", "dcgm-exporter", "sim"],
        help="GPU telemetry source: NVML (default), a node-local dcgm-exporter, or the simulator",
    )
    add("--sim-scenario", metavar="FILE", help="scenario YAML for --source sim (faults to inject)")
    add("--sim-seed", type=int, metavar="N", help="seed of the simulator's noise (default 0)")
    add(
        "--kmsg-path",
        metavar="PATH",
        help="kernel log to follow for NVRM Xid lines (default /dev/kmsg; a file or FIFO "
        "works too; 'none' disables)",
    )
    add("--listen", metavar="HOST:PORT", help="HTTP listen address (default 0.0.0.0:9455)")
    add(
        "--controller-url",
        metavar="URL",
        help="controller stream URL, e.g. wss://gpuhealth-controller:8443/v1/stream "
        "(default: none, the agent runs stand-alone)",
    )
    add(
        "--controller-shards",
        type=int,
        metavar="S",
        help="the controller's shard count; above 1, --controller-url holds {shard} (default 1)",
    )
    add("--controller-ca-file", metavar="FILE", help="CA bundle for the controller's certificate")
    add(
        "--token-file",
        metavar="PATH",
        help="projected ServiceAccount token sent to the controller, re-read when rotated "
        "(default /var/run/secrets/gpuhealth/token)",
    )
    add(
        "--state-dir",
        metavar="DIR",
        help="durable outbox and latched verdicts (default /var/lib/gpuhealth)",
    )
    add(
        "--dcgm-exporter-url",
        metavar="URL",
        help="dcgm-exporter metrics URL for --source dcgm-exporter "
        "(default http://127.0.0.1:9400/metrics)",
    )
    add(
        "--podresources-socket",
        metavar="PATH",
        help="kubelet PodResources socket for GPU -> pod attribution "
        "(default /var/lib/kubelet/pod-resources/kubelet.sock; 'none' disables)",
    )
    add(
        "--rdma-sysfs-root",
        metavar="PATH",
        help="sysfs of the host, for the InfiniBand and RoCE ports beside the GPUs "
        "(default /sys; 'none' disables)",
    )
    add(
        "--expected-gpus",
        type=int,
        metavar="N",
        help="GPUs this node should have; fewer visible is a liveness verdict "
        "(default: as many as NVML finds at start)",
    )
    add("--log-format", choices=["auto", "json", "console"], help="log format (default auto)")
    add(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="log level (default info)",
    )
    add("--print-config", action="store_true", help="print the effective configuration and exit")
    add("--version", action="version", version=f"gpuhealth-agent {__version__}")
    return p


_FLAT = (
    "node_name", "source", "sim_scenario", "sim_seed", "kmsg_path", "listen", "controller_url",
    "controller_shards", "controller_ca_file", "token_file", "state_dir", "dcgm_exporter_url",
    "log_format", "log_level",
)  # fmt: skip


def overrides_from(args: argparse.Namespace) -> dict[str, Any]:
    """The flags that were given, as config keys (nested ones as sections)."""
    out: dict[str, Any] = {k: getattr(args, k) for k in _FLAT if getattr(args, k) is not None}
    if args.expected_gpus is not None:
        out["nvml"] = {"expected_gpus": args.expected_gpus}
    if args.podresources_socket is not None:
        if args.podresources_socket.strip().lower() == "none":
            out["podresources"] = {"enabled": False}
        else:
            out["podresources"] = {"socket": args.podresources_socket}
    if args.rdma_sysfs_root is not None:
        if args.rdma_sysfs_root.strip().lower() == "none":
            out["rdma"] = {"enabled": False}
        else:
            out["rdma"] = {"sysfs_root": args.rdma_sysfs_root}
    return out


def config_from_args(argv: Sequence[str] | None = None) -> tuple[AgentSettings, argparse.Namespace]:
    args = build_parser().parse_args(argv)
    return load_config(args.config, overrides_from(args)), args


def main(argv: Sequence[str] | None = None) -> int:
    """The agent (no subcommand), or an operator command when argv starts with one."""
    argv = list(sys.argv[1:] if argv is None else argv)
    from gpuhealth.agent.admin_cli import SUBCOMMANDS

    if argv and argv[0] in SUBCOMMANDS:
        from gpuhealth.agent.admin_cli import main as admin_main

        return admin_main(argv)
    try:
        config, args = config_from_args(argv)
    except ConfigError as exc:
        print(f"gpuhealth-agent: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(yaml.safe_dump(msgspec.to_builtins(config), sort_keys=False), end="")
        return 0
    fmt = config.log_format
    glog.configure(json=None if fmt == "auto" else fmt == "json", level=config.log_level)

    try:
        restart = asyncio.run(_run(config))
    except ConfigError as exc:  # a missing token or CA file, an unusable state dir
        print(f"gpuhealth-agent: {exc}", file=sys.stderr)
        return 2
    except GpuHealthError as exc:
        print(f"gpuhealth-agent: {exc}", file=sys.stderr)
        return 1
    if restart:  # a simulated reboot: a fresh process, as after a real one
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, [sys.executable, "-m", "gpuhealth.agent.cli", *argv])
    return 0


async def _run(config: AgentSettings) -> bool:
    """Runs the agent until it stops; True when it asked to be started again."""
    from gpuhealth.agent.wiring import build_agent

    app = build_agent(config)
    await app.run()
    return app.restart_requested


if __name__ == "__main__":
    sys.exit(main())
