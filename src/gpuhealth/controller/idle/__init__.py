"""Idle GPU allocations: a pod holding a GPU it does not use.

- :mod:`~gpuhealth.controller.idle.settings`: the ``idle:`` configuration section;
- :mod:`~gpuhealth.controller.idle.rules`: the pure rules (windows, verdicts, Event cadence);
- :mod:`~gpuhealth.controller.idle.tracker`: follows the fleet's heartbeats, evaluates every window,
  exports the metrics and writes pod Events/annotations (never evicts).
"""

from gpuhealth.controller.idle.settings import IdleSettings, NamespaceIdleSettings
from gpuhealth.controller.idle.tracker import IdleAllocation, IdleTracker

__all__ = ["IdleAllocation", "IdleSettings", "IdleTracker", "NamespaceIdleSettings"]
