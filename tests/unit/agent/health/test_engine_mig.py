"""The engine keeps each GPU's MIG devices: in its GpuInfo (MIG UUID -> parent on the wire)
and for the PodResources directory; a new layout is a new version (a Snapshot goes out)."""

from __future__ import annotations

from dataclasses import replace

from gpuhealth.agent.observations import MigDevice
from gpuhealth.protocol import MigDeviceInfo
from tests.unit.agent.health.test_engine import U0, World

M1 = MigDevice("MIG-4e1f0c2a-9b8d-5e6f-a7b8-c9d0e1f2a3b4", gpu_instance_id=7,
               compute_instance_id=0, processes=0, utilization_ratio=0.0)  # fmt: skip
M2 = MigDevice("MIG-4e1f0c2a-9b8d-5e6f-a7b8-c9d0e1f2a3b5", gpu_instance_id=9,
               compute_instance_id=0)  # fmt: skip


def test_mig_layout_reaches_gpu_info_and_bumps_the_version_once() -> None:
    w = World()
    v0 = w.engine.devices_version
    w.sample(mig_mode=True, mig_devices=(M1, M2))
    assert w.engine.devices_version == v0 + 1
    info = w.gpu0.info
    assert info.mig_enabled
    assert info.mig_devices == [
        MigDeviceInfo(uuid=M1.uuid, gpu_instance_id=7, compute_instance_id=0),
        MigDeviceInfo(uuid=M2.uuid, gpu_instance_id=9, compute_instance_id=0),
    ]
    assert w.engine.mig_devices() == {U0: (M1, M2)}
    # usage changes (processes, memory) are not a new layout
    w.sample(mig_mode=True, mig_devices=(replace(M1, processes=3, utilization_ratio=None), M2))
    assert w.engine.devices_version == v0 + 1
    assert w.engine.mig_devices()[U0][0].processes == 3
    # an instance destroyed
    w.sample(mig_mode=True, mig_devices=(M2,))
    assert w.engine.devices_version == v0 + 2
    assert [m.uuid for m in w.gpu0.info.mig_devices] == [M2.uuid]


def test_a_source_without_mig_data_changes_nothing() -> None:
    w = World()
    w.sample(mig_mode=True, mig_devices=(M1,))
    v = w.engine.devices_version
    w.sample(mig_devices=None)  # e.g. dcgm-exporter: no MIG device list
    assert w.engine.devices_version == v
    assert w.engine.mig_devices() == {U0: (M1,)}
