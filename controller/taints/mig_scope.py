"""Which of a GPU's MIG devices an unhealthy verdict covers (pure).

On a GPU in MIG mode the DRA driver publishes the MIG devices carved from it (and, with
partitionable devices, the full GPU too). A fault of the GPU takes all of them out; a fault
the driver attributed to one GPU instance (the kernel log's ``GPU-I:NN``, carried as
``Condition.gpu_instance``) may be confined to that instance. The rule:

- Only the conditions at ``unhealthy`` severity count (only they make a DeviceTaintRule).
- A condition is confined to its instance when it names one (``gpu_instance``) **and** its
  action touches nothing beyond that instance's processes (:data:`INSTANCE_ACTIONS`). An
  action such as ``RESET_GPU`` or ``RESTART_BM`` resets the whole GPU, which destroys every
  MIG device on it, so a verdict with it is GPU-wide even when the driver named an instance.
- The verdict is instance-scoped when every counted condition is confined and the agent's
  MIG devices (``GpuInfo.mig_devices``) name a MIG device for every instance involved (all
  compute instances of a GPU instance share its memory: each of its MIG devices is covered).
  Otherwise it is GPU-wide: the GPU's own device and every MIG device carved from it.

With the XID catalog as shipped every unhealthy XID calls for ``RESET_GPU`` or more, so in
practice a verdict is GPU-wide; the instance scope is there for a condition that is not.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpuhealth.protocol import Condition
from gpuhealth.protocol.v1 import MigDeviceInfo

INSTANCE_ACTIONS: frozenset[str] = frozenset({"NONE", "IGNORE", "RESTART_APP"})
"""Actions whose effect stays inside one MIG GPU instance (its processes restart)."""


def confined_instances(conditions: Iterable[Condition]) -> frozenset[int] | None:
    """The GPU instances an unhealthy verdict is confined to; None: the whole GPU."""
    instances: set[int] = set()
    for c in conditions:
        if c.severity != "unhealthy":
            continue
        if c.gpu_instance is None or c.action not in INSTANCE_ACTIONS:
            return None
        instances.add(c.gpu_instance)
    return frozenset(instances) or None


def instance_devices(
    conditions: Iterable[Condition], mig_devices: Sequence[MigDeviceInfo]
) -> tuple[str, ...]:
    """The MIG UUIDs an instance-scoped verdict covers; empty: the verdict is GPU-wide
    (not confined, or an instance the agent names no MIG device for)."""
    instances = confined_instances(conditions)
    if instances is None:
        return ()
    covered = [m for m in mig_devices if m.gpu_instance_id in instances]
    if {m.gpu_instance_id for m in covered} != instances:
        return ()
    return tuple(sorted({m.uuid for m in covered}))
