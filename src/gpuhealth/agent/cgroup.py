"""Which pod and container a process belongs to, from ``/proc/<pid>/cgroup`` (pure parser).

The kubelet puts every container in a cgroup under ``kubepods``; both cgroup drivers and both
cgroup versions are understood:

- cgroupfs driver: ``/kubepods/burstable/pod<uid>/<container-id>`` (Guaranteed pods sit
  directly under ``/kubepods/pod<uid>``);
- systemd driver: ``/kubepods.slice/kubepods-burstable.slice/
  kubepods-burstable-pod<uid_with_underscores>.slice/cri-containerd-<id>.scope`` (also
  ``crio-<id>.scope``, ``docker-<id>.scope``);
- cgroup v1 lines are ``hierarchy:controllers:path``; v2 has the single line ``0::path``;
- the path may carry a prefix (nested runtimes, kind) before ``kubepods``, and a custom
  kubelet cgroup root prefixes the slice names (``kubelet-kubepods-…``).

The agent needs the host PID namespace (``hostPID: true``) so NVML's PIDs are its PIDs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_UID = r"[0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12}"
_POD_SEGMENT = re.compile(rf"^(?:(?:[a-z0-9]+-)*kubepods(?:-[a-z]+)?-)?pod({_UID})(?:\.slice)?$")
_CONTAINER_SEGMENT = re.compile(
    r"^(?:(?:cri-containerd|crio|docker|containerd|cri-o)-)?([0-9a-f]{64})(?:\.scope)?$"
)

MAX_CGROUP_FILE_BYTES = 64 * 1024
"""A /proc/<pid>/cgroup file is a few hundred bytes; anything larger is not read further."""


@dataclass(frozen=True, slots=True)
class CgroupOwner:
    pod_uid: str
    """Canonical form, with dashes."""
    container_id: str | None
    """The runtime's 64-hex container ID; ``None`` for a process in the pod cgroup itself."""


def parse_cgroup_path(path: str) -> CgroupOwner | None:
    """The pod and container of one cgroup path, or ``None`` outside ``kubepods``."""
    segments = [s for s in path.split("/") if s]
    for i in range(len(segments) - 1, -1, -1):
        m = _POD_SEGMENT.match(segments[i])
        if m is None:
            continue
        if not any("kubepods" in s for s in segments[: i + 1]):
            return None
        uid = m.group(1).replace("_", "-").lower()
        container: str | None = None
        if i + 1 < len(segments):
            c = _CONTAINER_SEGMENT.match(segments[i + 1])
            if c is None:
                return None
            container = c.group(1)
        return CgroupOwner(pod_uid=uid, container_id=container)
    return None


def parse_proc_cgroup(text: str) -> CgroupOwner | None:
    """The owner named by the contents of ``/proc/<pid>/cgroup``.

    Prefers the unified (v2) line; otherwise the first v1 hierarchy that names a pod.
    ``conmon`` and other helper scopes (``crio-conmon-<id>.scope``) do not count.
    """
    unified: CgroupOwner | None = None
    legacy: CgroupOwner | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, _controllers, path = parts
        owner = parse_cgroup_path(path.strip())
        if owner is None:
            continue
        if hierarchy == "0":
            unified = owner
        elif legacy is None:
            legacy = owner
    return unified or legacy


def read_owner(pid: int, proc: Path = Path("/proc")) -> CgroupOwner | None:
    """Read and parse ``/proc/<pid>/cgroup``; ``None`` when the process is gone or unknown."""
    try:
        with (proc / str(pid) / "cgroup").open("rb") as f:
            data = f.read(MAX_CGROUP_FILE_BYTES)
    except OSError:
        return None
    return parse_proc_cgroup(data.decode("utf-8", "replace"))
