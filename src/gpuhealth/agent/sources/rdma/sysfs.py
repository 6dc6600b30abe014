"""One RDMA device's ports read from sysfs (in the device's own thread), and what the files say.

``/sys/class/infiniband/<dev>/ports/<n>/`` holds ``state`` (``4: ACTIVE``), ``phys_state``
(``5: LinkUp``), ``rate`` (``400 Gb/sec (4X NDR)``), ``link_layer`` (``InfiniBand`` or
``Ethernet``), ``counters/`` (the InfiniBand PortCounters, answered by the NIC's firmware:
fixed widths, they stop at their maximum; ``N/A (no PMA)`` or an error where the port has no
performance-management agent) and ``hw_counters/`` (the driver's own, 64 bits).

Nothing here raises for a bad file: a missing counter is not served (absent), an unreadable
file or a garbage value is a :class:`FileProblem` the source logs and counts, and the value is
left out (never judged). A device whose directory vanished while it was read is
:class:`DeviceGone` (a hot-removed NIC).
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar

from gpuhealth.agent.health.rail_settings import ERROR_COUNTERS, LINK_DOWNED
from gpuhealth.agent.observations import NicPortSample, PciAddress
from gpuhealth.agent.sources.rdma.settings import Pairing
from gpuhealth.agent.sources.rdma.topology import GpuPlace, nic_functions, pair, read_numa_node

PORT_COUNTER_WIDTHS: dict[str, int] = {
    "symbol_error": 16,
    "link_error_recovery": 8,
    LINK_DOWNED: 8,
    "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16,
    "port_rcv_switch_relay_errors": 16,
    "port_xmit_discards": 16,
    "port_xmit_constraint_errors": 8,
    "port_rcv_constraint_errors": 8,
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
    "VL15_dropped": 16,
}
"""``counters/``: the InfiniBand PortCounters the kernel serves, with their widths in bits
(the kernel's ``PORT_PMA_ATTR`` table); at ``2**width - 1`` a counter has stopped."""
HW_COUNTERS: tuple[str, ...] = tuple(c for c in ERROR_COUNTERS if c not in PORT_COUNTER_WIDTHS)
"""``hw_counters/``: the driver's error counters that are read (mlx5's names)."""

_UNAVAILABLE_ERRNOS = frozenset(
    {errno.EINVAL, errno.EOPNOTSUPP, errno.ENODATA, errno.ENOSYS, errno.ENXIO}
)
"""What a counter file answers where the port has no performance-management agent (the
kernel once wrote ``N/A (no PMA)`` instead)."""
_STATE = re.compile(r"^\s*(\d+)\s*:\s*([A-Za-z_ ]+?)\s*$")
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec\b")
MAX_VALUE_BYTES = 256
T = TypeVar("T")
MAX_PORTS = 255


class DeviceGone(Exception):
    """The device's directory vanished (the NIC was hot-removed, its driver unloaded)."""


ProblemKind = Literal["unreadable", "garbage"]


@dataclass(frozen=True, slots=True)
class FileProblem:
    """A file the read could not use."""

    path: str
    """Relative to the device's directory (``ports/1/counters/symbol_error``)."""
    kind: ProblemKind
    detail: str


@dataclass(frozen=True, slots=True)
class DeviceRead:
    """One device's ports at one poll, and what could not be used."""

    ports: tuple[NicPortSample, ...]
    problems: tuple[FileProblem, ...] = ()
    unavailable: tuple[str, ...] = ()
    """Counters the port does not serve (``ports/<n>/counters/<name>``)."""
    virtual_function: bool = False
    complete: bool = True
    """False: the device's ports could not be listed (nothing about it is judged)."""


def parse_state(text: str) -> str | None:
    """``4: ACTIVE`` -> ``ACTIVE``, ``5: LinkUp`` -> ``LinkUp``; None for anything else."""
    m = _STATE.match(text)
    return m.group(2) if m else None


def parse_rate(text: str) -> float | None:
    """``400 Gb/sec (4X NDR)`` -> 400.0, ``2.5 Gb/sec (1X SDR)`` -> 2.5; None otherwise."""
    m = _RATE.match(text)
    if m is None:
        return None
    value = float(m.group(1))
    return value if 0.0 <= value <= 100_000.0 else None


def parse_counter(text: str) -> int | None:
    """A counter's decimal value; None for anything else (``N/A (no PMA)`` is tested for by
    the caller: a counter the port does not serve, not garbage)."""
    s = text.strip()
    if not s.isascii() or not s.isdigit() or len(s) > 20:
        return None
    value = int(s)
    return value if value < 2**64 else None


@dataclass
class _Reader:
    """The reads of one device at one poll."""

    base: Path
    problems: list[FileProblem] = field(default_factory=list)
    unavailable: list[str] = field(default_factory=list)

    def text(self, rel: str, *, optional: bool = False) -> str | None:
        """A file's text; None when absent (``optional``) or unusable (a problem)."""
        try:
            with open(self.base / rel, "rb") as f:
                data = f.read(MAX_VALUE_BYTES + 1)
        except FileNotFoundError:
            if not self.base.is_dir():
                raise DeviceGone(self.base.name) from None
            if not optional:
                self.problems.append(FileProblem(rel, "unreadable", "missing"))
            return None
        except OSError as exc:
            if not self.base.is_dir():
                raise DeviceGone(self.base.name) from exc
            if optional and exc.errno in _UNAVAILABLE_ERRNOS:
                self.unavailable.append(rel)
                return None
            self.problems.append(FileProblem(rel, "unreadable", exc.strerror or str(exc)))
            return None
        if len(data) > MAX_VALUE_BYTES:
            self.problems.append(FileProblem(rel, "garbage", f"over {MAX_VALUE_BYTES} bytes"))
            return None
        return data.decode("ascii", "replace")

    def parsed(self, rel: str, parse: Callable[[str], T | None]) -> T | None:
        text = self.text(rel)
        if text is None:
            return None
        value = parse(text)
        if value is None:
            self.problems.append(FileProblem(rel, "garbage", repr(text.strip()[:64])))
        return value

    def counters(self, port: str) -> tuple[dict[str, int], frozenset[str]]:
        values: dict[str, int] = {}
        saturated: set[str] = set()
        wanted = [("counters", n) for n in PORT_COUNTER_WIDTHS] + [
            ("hw_counters", n) for n in HW_COUNTERS
        ]
        for folder, name in wanted:
            rel = f"ports/{port}/{folder}/{name}"
            text = self.text(rel, optional=True)
            if text is None:
                continue
            if text.strip().startswith("N/A"):
                self.unavailable.append(rel)
                continue
            value = parse_counter(text)
            if value is None:
                self.problems.append(FileProblem(rel, "garbage", repr(text.strip()[:64])))
                continue
            values[name] = value
            width = PORT_COUNTER_WIDTHS.get(name) if folder == "counters" else None
            if width is not None and value >= 2**width - 1:
                saturated.add(name)
        return values, frozenset(saturated)


def read_device(
    root: Path,
    name: str,
    gpus: Mapping[PciAddress, GpuPlace],
    *,
    reach: Pairing = "root-complex",
) -> DeviceRead:
    """Every port of the RDMA device ``name`` under ``root`` (the sysfs root), paired with the
    GPUs among ``gpus`` behind it. Raises :class:`DeviceGone` when the device vanished."""
    base = root / "class" / "infiniband" / name
    reader = _Reader(base)
    try:
        entries = os.listdir(base / "ports")
    except FileNotFoundError:
        raise DeviceGone(name) from None
    except OSError as exc:
        if not base.is_dir():
            raise DeviceGone(name) from exc
        problem = FileProblem("ports", "unreadable", exc.strerror or str(exc))
        return DeviceRead((), (problem,), complete=False)
    numbers = []
    for entry in entries:
        if entry.isdigit() and int(entry) <= MAX_PORTS:
            numbers.append(int(entry))
        else:
            reader.problems.append(FileProblem(f"ports/{entry}", "garbage", "not a port number"))
    nic = nic_functions(root, base)
    numa = read_numa_node(root, nic.functions[0]) if nic.functions else -1
    behind, near = pair(nic.functions, gpus, numa_node=numa, reach=reach)
    model = (reader.text("hca_type", optional=True) or "").strip()[:64]
    ports = []
    for n in sorted(numbers):
        p = str(n)
        values, saturated = reader.counters(p)
        ports.append(
            NicPortSample(
                device=name,
                port=n,
                link_layer=(reader.text(f"ports/{p}/link_layer") or "").strip()[:32],
                port_state=reader.parsed(f"ports/{p}/state", parse_state),
                phys_state=reader.parsed(f"ports/{p}/phys_state", parse_state),
                rate_gbps=reader.parsed(f"ports/{p}/rate", parse_rate),
                counters=values,
                saturated=saturated,
                model=model,
                netdev=nic.netdev[:64],
                gpus=behind,
                affinity=near or "",
            )
        )
    return DeviceRead(
        tuple(ports),
        tuple(reader.problems),
        tuple(reader.unavailable),
        virtual_function=nic.virtual_function,
    )
