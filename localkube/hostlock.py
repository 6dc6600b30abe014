"""One real node per host, and a record of what to undo if a run dies without cleaning up.

The kubelet's root directory, the device-plugin socket directory and the pod bridge are
host-wide, so node harnesses (two checkouts running ``make e2e``) take turns through an
exclusive lock. While a node runs, a ledger next to the lock holds the host snapshot taken
before it started; a run that was killed outright (SIGKILL, a lost machine) leaves it
behind, and the next run restores the host from it before it starts.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path
from typing import IO, Any

from localkube.process import LocalKubeError

LOCK_POLL_S = 1.0


def state_dir() -> Path:
    root = os.environ.get("GPUHEALTH_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "gpuhealth"
    )
    path = Path(root) / "node"
    path.mkdir(parents=True, exist_ok=True)
    return path


class HostLock:
    """``with HostLock(timeout_s):`` — exclusive, waits up to ``timeout_s``."""

    def __init__(self, timeout_s: float, on_wait: Any = None) -> None:
        self.path = state_dir() / "node.lock"
        self.timeout_s = timeout_s
        self._on_wait = on_wait
        self._file: IO[str] | None = None

    def acquire(self) -> None:
        f = self.path.open("a")
        deadline = time.monotonic() + self.timeout_s
        told = False
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    f.close()
                    raise LocalKubeError(
                        f"another localkube node held {self.path} for {self.timeout_s:.0f}s"
                    ) from None
                if not told and self._on_wait is not None:
                    self._on_wait(f"waiting for another localkube node to stop ({self.path})")
                    told = True
                time.sleep(LOCK_POLL_S)
        self._file = f

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None


class Ledger:
    """The host snapshot and the cleanup scope of the node that is running (or died)."""

    def __init__(self) -> None:
        self.path = state_dir() / "ledger.json"

    def write(self, snapshot_json: str, markers: tuple[str, ...], roots: tuple[str, ...]) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps({"snapshot": snapshot_json, "markers": markers, "mount_roots": roots})
        )
        tmp.replace(self.path)

    def read(self) -> tuple[str, tuple[str, ...], tuple[str, ...]] | None:
        try:
            d = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, json.JSONDecodeError) as exc:
            raise LocalKubeError(f"unreadable node ledger {self.path}: {exc}") from exc
        return d["snapshot"], tuple(d["markers"]), tuple(d["mount_roots"])

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
