"""Put the host back the way a :class:`localkube.hoststate.HostState` found it.

The node harness stops its components in order first (that alone leaves little behind);
this is the net under it, run on every stop and also after a failed or interrupted start:
it kills what the node started, unmounts what it mounted, removes the cgroups, links,
iptables rules and chains it created, writes back the kernel settings it changed and removes
the directories it made. Only differences from the snapshot are touched, and only mounts
under the node's own roots.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from localkube import hoststate
from localkube.hoststate import CGROUP_ROOT, HostState

KILL_WAIT_S = 10.0
"""How long killed processes get to disappear before the cleanup goes on regardless."""
CGROUP_RMDIR_ATTEMPTS = 50
"""rmdir of a cgroup fails while its last tasks are exiting; retried this many times."""
RETRY_INTERVAL_S = 0.1


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def kill_pids(pids: Iterable[int]) -> None:
    """SIGKILL ``pids`` and wait (bounded) until they are gone."""
    targets = [p for p in pids if p != os.getpid()]
    for pid in targets:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT_S
    while any(_alive(p) for p in targets) and time.monotonic() < deadline:
        time.sleep(RETRY_INTERVAL_S)


def _cgroup_pids(rel: str) -> set[int]:
    try:
        text = (CGROUP_ROOT / rel / "cgroup.procs").read_text()
    except OSError:
        return set()
    return {int(p) for p in text.split()}


def new_cgroups(before: HostState) -> list[str]:
    """Cgroups created since ``before``, with everything below them, deepest first."""
    roots = sorted(hoststate.cgroup_dirs() - before.cgroups)
    found: set[str] = set()
    for rel in roots:
        for top, _dirs, _files in os.walk(CGROUP_ROOT / rel):
            found.add(str(Path(top).relative_to(CGROUP_ROOT)))
    return sorted(found, key=lambda r: (-r.count("/"), r))


def kill_cgroup_tasks(cgroups: list[str]) -> None:
    kill_pids(set().union(*(_cgroup_pids(c) for c in cgroups)) if cgroups else set())


def remove_cgroups(cgroups: list[str]) -> list[str]:
    """rmdir each (deepest first); the ones that would not go."""
    stuck = []
    for rel in cgroups:
        path = CGROUP_ROOT / rel
        for _ in range(CGROUP_RMDIR_ATTEMPTS):
            try:
                path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                kill_pids(_cgroup_pids(rel))
                time.sleep(RETRY_INTERVAL_S)
        else:
            stuck.append(rel)
    return stuck


def unmount_under(before: HostState, roots: Iterable[str]) -> list[str]:
    """Unmount every mount point made since ``before`` under one of ``roots``, deepest first
    (lazily if it is busy); the ones still mounted."""
    prefixes = [r.rstrip("/") for r in roots]

    def ours(point: str) -> bool:
        return any(point == r or point.startswith(r + "/") for r in prefixes)

    for _ in range(3):  # a mount can be stacked several times on the same point
        points = sorted(
            (p for p in hoststate.mount_points() - before.mounts if ours(p)),
            key=lambda p: (-p.count("/"), p),
        )
        if not points:
            return []
        for point in points:
            if _run("umount", point).returncode != 0:
                _run("umount", "-l", point)
    return sorted(p for p in hoststate.mount_points() - before.mounts if ours(p))


def delete_links(before: HostState) -> None:
    for name in sorted(hoststate.links() - before.links):
        _run("ip", "link", "delete", name)


def restore_iptables(before: HostState) -> None:
    """Delete the rules and chains added since ``before`` (rules first, newest first), then
    the tables that did not exist (nf_tables backend: with ``nft``)."""
    for key, lines in hoststate.iptables_rules().items():
        binary, table = key.split()
        old = set(before.iptables.get(key, ()))
        added_rules = [ln for ln in lines if ln.startswith("-A ") and ln not in old]
        for rule in reversed(added_rules):
            _run(binary, "-w", "-t", table, "-D", *shlex.split(rule)[1:])
        added_chains = [ln.split()[0][1:] for ln in lines if ln.startswith(":") and ln not in old]
        for chain in added_chains:
            _run(binary, "-w", "-t", table, "-F", chain)
        for chain in added_chains:
            _run(binary, "-w", "-t", table, "-X", chain)
        if key not in before.iptables and shutil.which("nft") is not None:
            family = "ip6" if binary == "ip6tables" else "ip"
            _run("nft", "delete", "table", family, table)


def restore_sysctls(before: HostState) -> None:
    for name, value in before.sysctls.items():
        if hoststate.read_sysctl(name) != value:
            path = Path("/proc/sys") / name.replace(".", "/")
            with contextlib.suppress(OSError):
                path.write_text(value.replace(" ", "\t") + "\n")


def remove_paths(before: HostState) -> list[str]:
    """Remove watched directories (or entries of them) created since ``before``, never
    crossing into another file system; the ones that remain."""
    left = []
    for name, entries in hoststate.watched_paths().items():
        old = before.paths.get(name)
        if entries is None:
            continue
        targets = [name] if old is None else [f"{name}/{e}" for e in entries if e not in old]
        for target in targets:
            _run("rm", "-rf", "--one-file-system", target)
            if os.path.lexists(target):
                left.append(target)
    return left


def restore(
    before: HostState,
    *,
    markers: tuple[str, ...],
    mount_roots: tuple[str, ...],
    log: Callable[[str], None] = lambda _msg: None,
) -> list[str]:
    """Every step above, in an order that lets each succeed; what could not be undone."""
    kill_pids(hoststate.processes(markers) - before.processes)
    cgroups = new_cgroups(before)
    kill_cgroup_tasks(cgroups)
    problems = [f"mount {p}" for p in unmount_under(before, mount_roots)]
    problems += [f"cgroup {c}" for c in remove_cgroups(new_cgroups(before))]
    delete_links(before)
    restore_iptables(before)
    restore_sysctls(before)
    if problems:  # never remove a directory something may still be mounted under
        log(f"host cleanup: left directories in place because of {problems}")
        return problems
    return [f"path {p}" for p in remove_paths(before)]
