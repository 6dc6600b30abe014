"""The RDMA source's settings: the ``rdma:`` section (with the rail verdicts' thresholds in
``rdma.rails``, :mod:`gpuhealth.agent.health.rail_settings`)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from gpuhealth.agent.health.rail_settings import RailSettings
from gpuhealth.common.config import PositiveSeconds, SettingError, Settings

DeviceName = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
Pairing = Literal["switch", "root-complex", "numa-node"]
DEFAULT_SYSFS_ROOT = "/sys"


class RdmaSettings(Settings, frozen=True, kw_only=True):
    """Which InfiniBand and RoCE ports are watched, how often, and how each NIC is paired with
    the GPUs its verdicts reach."""

    enabled: bool = True
    """Watch the node's InfiniBand and RoCE ports (``<sysfs_root>/class/infiniband``). A node
    without any costs one directory look-up per poll and raises nothing; a NIC whose driver
    loads later is found at the next poll."""
    sysfs_root: str | None = None
    """Where the host's sysfs is mounted. The chart mounts the host's /sys read-only at
    /host/sys: the container's own /sys shows only its network namespace's network devices
    (a RoCE port's netdev and bond) and, in the RDMA subsystem's exclusive mode, none of the
    host's RDMA devices. None: ``/sys`` on a node read through NVML or dcgm-exporter; with
    the simulator (``source: sim``) no host NIC is read (its scenario's ``nics`` stand for
    them: simulated GPUs beside a real machine's NICs would pair nothing real)."""
    poll_interval_s: PositiveSeconds = 10.0
    """How often every port's state, rate and counters are read (the counters are answered by
    the NIC's firmware: a few commands per port and poll)."""
    read_deadline_s: PositiveSeconds = 5.0
    """One NIC's read (in a thread of its own) must finish within this. One that does not is
    unread that poll (its ports keep their verdicts, nothing is judged from them) and not
    asked again until its read returns."""
    devices: frozenset[DeviceName] = frozenset()
    """Watch only these RDMA devices (``mlx5_0``, ``mlx5_bond_0``); empty: every one. Leave
    out a NIC whose faults should reach no GPU (a storage or management NIC beside them)."""
    include_virtual_functions: bool = False
    """Watch SR-IOV virtual functions too (their ports mirror their physical function's link,
    which is watched already)."""
    pairing: Pairing = "root-complex"
    """How far a GPU may be from a NIC and still be behind it: ``switch`` (a PCIe switch they
    share: PIX/PXB), ``root-complex`` (else the PCIe root complex they share: PHB), or
    ``numa-node`` (else the NUMA node: NODE). Each NIC pairs with the GPUs closest to it
    within that reach; a NIC with none reaches no GPU (it is still exported and sent)."""
    rails: RailSettings = msgspec.field(default_factory=RailSettings)
    """When a port's state, rate, flaps and error counters make a rail verdict."""

    def check(self) -> None:
        if self.sysfs_root is not None and not self.sysfs_root.strip():
            raise SettingError("sysfs_root", "is empty")

    def root_for(self, source: str) -> str | None:
        """The sysfs root to read for the agent's GPU ``source``; None: no host NIC is read."""
        if self.sysfs_root is not None:
            return self.sysfs_root
        return None if source == "sim" else DEFAULT_SYSFS_ROOT
