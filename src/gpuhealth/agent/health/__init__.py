"""The health model: observations in, per-GPU states and transitions out (pure, no I/O).

- :mod:`.engine`: :class:`HealthEngine`, routes observations to the GPUs' trackers.
- :mod:`.gpu_tracker`: :class:`GpuTracker`, one GPU's tracker: the rules applied to it.
- :mod:`.rules`: the threshold rules as a table (condition code, reason, severity, action).
- :mod:`.hysteresis`: the small state machines the rules are built from.
- :mod:`.conditions`: building the protocol ``Condition`` of a verdict.
- :mod:`.xid_catalog`: what each XID means (``xid_catalog.yaml``).
- :mod:`.transition`: what the engine emits.
- :mod:`.settings`: every threshold, window and hysteresis setting (``health:``).
"""

from gpuhealth.agent.health.engine import HealthEngine
from gpuhealth.agent.health.settings import HealthSettings

__all__ = ["HealthEngine", "HealthSettings"]
