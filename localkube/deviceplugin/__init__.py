"""A test device plugin for localkube's real node: ``nvidia.com/gpu`` devices whose IDs are
the simulated GPUs' UUIDs.

It speaks the kubelet's real device-plugin API (v1beta1, gRPC over a unix socket in
``/var/lib/kubelet/device-plugins``): registers the resource, lists the devices, answers
Allocate. The kubelet then allocates them to pods like real GPUs, and its PodResources API
reports them — what the agent reads to attribute GPUs to pods. The UUIDs are computed by the
agent's own simulator from the same scenario and seed the agent is given (:func:`sim_gpu_uuids`),
so the IDs the kubelet hands out are the ones the agent's simulated GPUs carry.

Dev tooling, not in the wheel. ``python -m localkube.deviceplugin --help``.
"""

from localkube.deviceplugin.devices import sim_gpu_uuids

__all__ = ["sim_gpu_uuids"]
