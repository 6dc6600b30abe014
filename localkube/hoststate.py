"""What a real node changes on the host, snapshotted before and compared after.

A :class:`HostState` records the host objects a kubelet, containerd, kube-proxy and the CNI
bridge plugin create or change: mount points, cgroups, network links, iptables rules and
chains, kernel settings (sysctls), well-known directories, and processes. The node harness
takes one before it starts anything, puts the host back to it when it stops
(:mod:`localkube.hostcleanup`), and :func:`leftovers` says what is still different — the
test of that cleanup.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

SYSCTLS = (
    "net.ipv4.ip_forward",  # the bridge plugin's isGateway turns it on
    "net.ipv6.conf.all.forwarding",
    "net.ipv4.conf.all.route_localnet",  # kube-proxy, for localhost NodePorts
    "net.bridge.bridge-nf-call-iptables",
    "net.bridge.bridge-nf-call-ip6tables",
    "net.netfilter.nf_conntrack_max",  # kube-proxy's conntrack settings
    "net.netfilter.nf_conntrack_tcp_timeout_established",
    "net.netfilter.nf_conntrack_tcp_timeout_close_wait",
    "vm.overcommit_memory",  # the kubelet's "kernel defaults"
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
)
"""Kernel settings the node's components are known to write."""

WATCHED_PATHS = (
    "/var/lib/kubelet",
    "/var/log/pods",
    "/var/log/containers",
    "/var/lib/cni",
    "/var/lib/containerd",
    "/run/containerd",
    "/run/netns",
    "/etc/cni",
    "/opt/cni",
    "/opt/containerd",
    "/usr/libexec/kubernetes",
    "/etc/kubernetes",
    "/var/lib/gpuhealth",
)
"""Host directories a node writes by default: whether each exists, and what is in it."""

CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_DEPTH = 3
"""kubepods/<qos>/pod<uid>: deep enough to see every pod cgroup the kubelet makes."""


@dataclass(frozen=True)
class HostState:
    mounts: frozenset[str]
    cgroups: frozenset[str]
    links: frozenset[str]
    iptables: dict[str, tuple[str, ...]]
    """``"<binary> <table>"`` -> the table's chain and rule lines, counters stripped."""
    sysctls: dict[str, str]
    paths: dict[str, tuple[str, ...] | None]
    """Watched path -> its entries (None: absent; () for a file or an empty directory)."""
    processes: frozenset[int] = field(default_factory=frozenset)


def mount_points() -> frozenset[str]:
    points = set()
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        points.add(fields[4].replace("\\040", " "))
    return frozenset(points)


def cgroup_dirs() -> frozenset[str]:
    """Every cgroup directory down to :data:`CGROUP_DEPTH` in each v1 hierarchy (or v2)."""
    out: set[str] = set()
    if not CGROUP_ROOT.is_dir():
        return frozenset()
    for top, dirs, _files in os.walk(CGROUP_ROOT):
        rel = Path(top).relative_to(CGROUP_ROOT)
        if len(rel.parts) >= CGROUP_DEPTH + 1:
            dirs.clear()
        if rel.parts:
            out.add(str(rel))
    return frozenset(out)


def links() -> frozenset[str]:
    return (
        frozenset(os.listdir("/sys/class/net")) if Path("/sys/class/net").is_dir() else frozenset()
    )


def parse_iptables_save(family: str, text: str) -> dict[str, tuple[str, ...]]:
    """``"<family> <table>"`` -> chain (``:NAME POLICY``) and rule lines of ``*-save`` output,
    without counters and comments."""
    out: dict[str, tuple[str, ...]] = {}
    lines: list[str] = []
    key = ""
    for line in text.splitlines():
        if line.startswith("*"):
            key, lines = f"{family} {line[1:].strip()}", []
        elif line.startswith("COMMIT") and key:
            out[key], key = tuple(lines), ""
        elif key and line and not line.startswith("#"):
            # ":CHAIN POLICY [packets:bytes]" -> ":CHAIN POLICY"
            lines.append(" ".join(line.split()[:2]) if line.startswith(":") else line)
    return out


def iptables_rules() -> dict[str, tuple[str, ...]]:
    """Every existing table of ``iptables``/``ip6tables``. Never ``-t TABLE``: with the
    nf_tables backend that creates the table it asks about."""
    out: dict[str, tuple[str, ...]] = {}
    for family in ("iptables", "ip6tables"):
        if shutil.which(f"{family}-save") is None:
            continue
        result = subprocess.run([f"{family}-save"], capture_output=True, text=True, check=False)
        out.update(parse_iptables_save(family, result.stdout))
    return out


def read_sysctl(name: str) -> str | None:
    path = Path("/proc/sys") / name.replace(".", "/")
    try:
        return " ".join(path.read_text().split())
    except OSError:
        return None


def sysctls() -> dict[str, str]:
    values = {name: read_sysctl(name) for name in SYSCTLS}
    return {k: v for k, v in values.items() if v is not None}


def watched_paths() -> dict[str, tuple[str, ...] | None]:
    out: dict[str, tuple[str, ...] | None] = {}
    for name in WATCHED_PATHS:
        path = Path(name)
        if not path.exists() and not path.is_symlink():
            out[name] = None
        elif path.is_dir() and not path.is_symlink():
            out[name] = tuple(sorted(os.listdir(path)))
        else:
            out[name] = ()
    return out


def processes(markers: tuple[str, ...]) -> frozenset[int]:
    """Live processes (not this one) whose command line mentions one of ``markers`` (e.g.
    the node's work directory, which every process it starts names in its arguments)."""
    if not markers:
        return frozenset()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(m in cmdline for m in markers):
            found.add(int(entry.name))
    return frozenset(found)


def take(markers: tuple[str, ...] = ()) -> HostState:
    return HostState(
        mounts=mount_points(),
        cgroups=cgroup_dirs(),
        links=links(),
        iptables=iptables_rules(),
        sysctls=sysctls(),
        paths=watched_paths(),
        processes=processes(markers),
    )


def leftovers(before: HostState, after: HostState, *, workdir: Path | None = None) -> list[str]:
    """What ``after`` has that ``before`` had not (and changed settings), one line each.

    Mount points and processes are only compared under ``workdir`` and the watched paths
    when a ``workdir`` is given (other tenants of the machine mount things too).
    """
    found: list[str] = []
    roots = [*WATCHED_PATHS, *([str(workdir)] if workdir else [])]
    for point in sorted(after.mounts - before.mounts):
        if workdir is None or any(point == r or point.startswith(r + "/") for r in roots):
            found.append(f"mount {point}")
    found += [f"cgroup {c}" for c in sorted(after.cgroups - before.cgroups)]
    found += [f"link {name}" for name in sorted(after.links - before.links)]
    for key, lines in after.iptables.items():
        if key not in before.iptables:
            found.append(f"{key} (table created)")
            continue
        rules = set(before.iptables[key])
        found += [f"{key}: {line}" for line in lines if line not in rules]
    for name, value in after.sysctls.items():
        if before.sysctls.get(name) != value:
            found.append(f"sysctl {name}={value} (was {before.sysctls.get(name)})")
    for name, entries in after.paths.items():
        had = before.paths.get(name)
        if entries is not None and had is None:
            found.append(f"path {name} (created)")
        elif entries is not None and had is not None:
            found += [f"path {name}/{e}" for e in entries if e not in had]
    found += [f"process {pid}" for pid in sorted(after.processes - before.processes)]
    return found


def to_json(state: HostState) -> str:
    return json.dumps(
        {
            "mounts": sorted(state.mounts),
            "cgroups": sorted(state.cgroups),
            "links": sorted(state.links),
            "iptables": {k: list(v) for k, v in state.iptables.items()},
            "sysctls": state.sysctls,
            "paths": {k: None if v is None else list(v) for k, v in state.paths.items()},
            "processes": sorted(state.processes),
        }
    )


def from_json(text: str) -> HostState:
    d = json.loads(text)
    return HostState(
        mounts=frozenset(d["mounts"]),
        cgroups=frozenset(d["cgroups"]),
        links=frozenset(d["links"]),
        iptables={k: tuple(v) for k, v in d["iptables"].items()},
        sysctls=dict(d["sysctls"]),
        paths={k: None if v is None else tuple(v) for k, v in d["paths"].items()},
        processes=frozenset(d["processes"]),
    )
