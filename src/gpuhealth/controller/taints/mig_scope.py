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

- The driver's impact scope (``Condition.scope``, GPU Operational Events) decides first when
  it is set: ``gpu-instance`` with a ``gpu_instance`` confines the condition to that instance,
  ``compute-instance`` with both ids to that compute instance's MIG device alone (whatever
  the action: the driver says the fault stays there; the remediation loop never reboots
  the node for it, :func:`gpuhealth.controller.remediation.fault.scoped_action`). Any other
  scope (``gpu``, ``node``, ``nvlink-domain``), or an instance scope without the instance's
  id, is GPU-wide. Without a scope the action rule above applies (one mechanism for both).

With the XID catalog as shipped every unhealthy XID calls for ``RESET_GPU`` or more, so in
practice a verdict is GPU-wide; the instance scope is there for a condition that is not.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpuhealth.protocol import Condition
from gpuhealth.protocol.v1 import MigDeviceInfo

INSTANCE_ACTIONS: frozenset[str] = frozenset({"NONE", "IGNORE", "RESTART_APP"})
"""Actions whose effect stays inside one MIG GPU instance (its processes restart)."""


INSTANCE_SCOPES: frozenset[str] = frozenset({"gpu-instance", "compute-instance"})
"""Driver impact scopes (``Condition.scope``) that stay inside one MIG instance."""

Instance = tuple[int, int | None]
"""(GPU instance, compute instance or None: every compute instance of the GPU instance)."""


def condition_instance(c: Condition) -> Instance | None:
    """The MIG instance one condition is confined to; None: the whole GPU."""
    if c.gpu_instance is None:
        return None
    if c.scope is not None:
        if c.scope not in INSTANCE_SCOPES:
            return None
        ci = c.compute_instance if c.scope == "compute-instance" else None
        return (c.gpu_instance, ci)
    return (c.gpu_instance, None) if c.action in INSTANCE_ACTIONS else None


def confined(conditions: Iterable[Condition]) -> frozenset[Instance] | None:
    """The MIG instances an unhealthy verdict is confined to; None: the whole GPU."""
    out: set[Instance] = set()
    for c in conditions:
        if c.severity != "unhealthy":
            continue
        inst = condition_instance(c)
        if inst is None:
            return None
        out.add(inst)
    return frozenset(out) or None


def _covers(m: MigDeviceInfo, inst: Instance) -> bool:
    gi, ci = inst
    return m.gpu_instance_id == gi and (ci is None or m.compute_instance_id == ci)


def instance_devices(
    conditions: Iterable[Condition], mig_devices: Sequence[MigDeviceInfo]
) -> tuple[str, ...]:
    """The MIG UUIDs an instance-scoped verdict covers; empty: the verdict is GPU-wide
    (not confined, or an instance the agent names no MIG device for)."""
    instances = confined(conditions)
    if instances is None:
        return ()
    uuids: set[str] = set()
    for inst in instances:
        hit = [m.uuid for m in mig_devices if _covers(m, inst)]
        if not hit:
            return ()
        uuids.update(hit)
    return tuple(sorted(uuids))
