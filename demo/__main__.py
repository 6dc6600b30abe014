"""``python -m demo`` (``make demo``): see the package docstring; ``--help`` for options."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import demo
from demo.runner import run_demo
from demo.state import DemoSettings
from gpuhealth.common import logging as glog
from gpuhealth.common.errors import GpuHealthError

EXIT_SIGNAL_BASE = 128
"""Shell convention: killed by signal N exits 128 + N."""


def parse(argv: Sequence[str] | None) -> DemoSettings:
    ap = argparse.ArgumentParser(
        prog="python -m demo",
        description=demo.__doc__,
        epilog="Exit status: 0 every check passed, 1 a check failed, 2 the demo could not run, "
        "130/143 stopped by SIGINT/SIGTERM.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--nodes", type=int, default=9, help="kwok GPU nodes (default 9, min 5; 9 to replace one)"
    )
    ap.add_argument("--gpus", type=int, default=8, help="GPUs per node (default 8, min 7)")
    ap.add_argument(
        "--linger", type=float, default=10.0, help="seconds to keep running after all checks pass"
    )
    ap.add_argument(
        "--deadline", type=float, default=110.0, help="seconds after the agents start to pass"
    )
    ap.add_argument("--workdir", type=Path, help="where logs and configuration go (kept)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary work directory")
    ap.add_argument(
        "--plain", action="store_true", help="plain lines even on a terminal (no redraw)"
    )
    ap.add_argument(
        "--real-node",
        action="store_true",
        help="make the first node a real containerd + kubelet node (needs root; make demo "
        "REAL_NODE=1)",
    )
    a = ap.parse_args(argv)
    if a.nodes < 5 or a.gpus < 7:
        ap.error("the scenario needs at least 5 nodes of 7 GPUs")
    return DemoSettings(
        nodes=a.nodes,
        gpus=a.gpus,
        linger_s=a.linger,
        deadline_s=a.deadline,
        workdir=a.workdir,
        keep=a.keep,
        tty=False if a.plain else None,
        real_node=a.real_node,
    )


async def _main(settings: DemoSettings) -> int:
    """Run the demo; SIGINT and SIGTERM cancel it, which stops every child on the way out."""
    task = asyncio.current_task()
    assert task is not None
    got: list[int] = []
    loop = asyncio.get_running_loop()

    def stop(sig: int) -> None:
        if not got:
            print(f"\n{signal.Signals(sig).name}: stopping everything…", file=sys.stderr)
        got.append(sig)
        task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop, sig)
    try:
        return await run_demo(settings)
    except asyncio.CancelledError:
        if not got:
            raise
        return EXIT_SIGNAL_BASE + got[0]


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse(argv)
    glog.configure(json=False, level="warning")
    try:
        return asyncio.run(_main(settings))
    except GpuHealthError as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return EXIT_SIGNAL_BASE + signal.SIGINT
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
