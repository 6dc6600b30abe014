"""``python -m localkube.deviceplugin``: run the test device plugin until SIGTERM."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from gpuhealth.common import logging as glog
from gpuhealth.common.errors import ConfigError
from localkube.deviceplugin.devices import sim_gpu_uuids
from localkube.deviceplugin.server import DevicePluginServer
from localkube.kubelet import DEVICE_PLUGIN_DIR


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m localkube.deviceplugin", description=__doc__)
    p.add_argument("--resource", default="nvidia.com/gpu")
    p.add_argument(
        "--sim-scenario", type=Path, help="the agent's --sim-scenario (decides the GPU count)"
    )
    p.add_argument("--sim-seed", type=int, default=0, help="the agent's --sim-seed")
    p.add_argument("--socket-dir", type=Path, default=DEVICE_PLUGIN_DIR)
    p.add_argument("--name", default="gpuhealth-sim", help="socket name (without .sock)")
    p.add_argument("--record", type=Path, help="append each allocation (JSON lines) here")
    args = p.parse_args(argv)
    glog.configure(json=False, level="info")
    try:
        uuids = sim_gpu_uuids(args.sim_scenario, args.sim_seed)
    except ConfigError as exc:
        print(f"deviceplugin: {exc}", file=sys.stderr)
        return 2
    server = DevicePluginServer(args.resource, uuids, args.socket_dir, args.name, args.record)

    def stop(_sig: int, _frame: FrameType | None) -> None:
        server.stop.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"serving {len(uuids)} {args.resource}: {' '.join(uuids)}", flush=True)
    server.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
