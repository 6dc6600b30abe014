"""NVML source on MIG GPUs: MIG devices (UUID -> parent), per-instance usage, mode changes."""

from __future__ import annotations

from gpuhealth.agent.observations import GpuSample, Inventory, MigDevice
from tests.fakes.fake_pynvml import FakeMig, h100_node
from tests.unit.agent.sources.nvml.test_source import Run, running

MIG_A = "MIG-5f8e6a3c-1b2d-5e4f-8a9b-0c1d2e3f4a5b"
MIG_B = "MIG-7a1b2c3d-4e5f-5a6b-9c8d-7e6f5a4b3c2d"
MIG_C = "MIG-0b0c0d0e-1f2a-5b3c-8d4e-5f6a7b8c9d0e"


def last(r: Run, uuid: str) -> GpuSample:
    s = [x for x in r.of(GpuSample) if x.uuid == uuid][-1]  # type: ignore[attr-defined]
    assert isinstance(s, GpuSample)
    return s


def mig_node() -> tuple[object, list[FakeMig]]:
    fake = h100_node(2)
    g = fake.gpus[1]
    g.mig_mode = 1
    g.migs = [
        FakeMig(MIG_A, gpu_instance_id=7, profile_id=19, placement_start=0, memory_used=3 << 30),
        FakeMig(MIG_B, gpu_instance_id=9, profile_id=15, placement_start=4, placement_size=2,
                processes=[4242]),
    ]  # fmt: skip
    return fake, g.migs


async def test_mig_devices_carry_their_uuid_instance_and_usage() -> None:
    fake, _ = mig_node()
    async with running(fake) as r:  # type: ignore[arg-type]
        (inv,) = r.of(Inventory)
        assert [g.mig_enabled for g in inv.gpus] == [False, True]  # type: ignore[attr-defined]
        assert [g.minor_number for g in inv.gpus] == [0, 1]  # type: ignore[attr-defined]
        s = last(r, r.fake.gpus[1].uuid)
        assert s.mig_mode is True and s.mig_instances == 2
        assert s.mig_devices == (
            MigDevice(
                uuid=MIG_A, gpu_instance_id=7, compute_instance_id=0, profile_id=19,
                placement_start=0, placement_size=1, memory_used_bytes=3 << 30,
                memory_total_bytes=10 << 30, processes=0, utilization_ratio=0.0,
            ),
            MigDevice(
                uuid=MIG_B, gpu_instance_id=9, compute_instance_id=0, profile_id=15,
                placement_start=4, placement_size=2, memory_used_bytes=0,
                memory_total_bytes=10 << 30, processes=1, utilization_ratio=None,
            ),
        )  # fmt: skip
        # NVML has no utilisation for a GPU in MIG mode: absent, never 0
        assert s.utilization_ratio is None and s.process_utilization == {}
        plain = last(r, r.fake.gpus[0].uuid)
        assert plain.mig_mode is False and plain.mig_devices == ()
        assert plain.utilization_ratio == 0.7


async def test_identity_is_read_once_per_instance_usage_every_poll() -> None:
    fake, migs = mig_node()
    async with running(fake) as r:  # type: ignore[arg-type]
        g = r.fake.gpus[1]
        await r.next_poll()
        await r.next_poll()
        polls = r.source.polls.count
        assert g.calls["mig:nvmlDeviceGetUUID"] == 2
        assert g.calls["mig:nvmlDeviceGetMemoryInfo"] == 2 * polls
        # an instance destroyed and another created in its slot: a new handle, a new identity
        migs[0] = FakeMig(MIG_C, gpu_instance_id=8, profile_id=9, placement_start=0,
                          placement_size=4)  # fmt: skip
        migs[1].processes = []
        await r.next_poll()
        s = last(r, g.uuid)
        assert s.mig_devices is not None
        assert [(m.uuid, m.gpu_instance_id, m.profile_id) for m in s.mig_devices] == [
            (MIG_C, 8, 9),
            (MIG_B, 9, 15),
        ]
        assert s.mig_devices[1].utilization_ratio == 0.0
        assert g.calls["mig:nvmlDeviceGetUUID"] == 3


async def test_mig_mode_not_supported_is_asked_again_after_the_recheck_interval() -> None:
    fake = h100_node(1)
    g = fake.gpus[0]
    g.unsupported.add("nvmlDeviceGetMigMode")
    async with running(fake, mig_recheck_s=30.0) as r:
        await r.next_poll()
        assert last(r, g.uuid).mig_mode is None
        asked = g.calls["nvmlDeviceGetMigMode"]
        # the driver answers again (a mode change took effect): MIG mode with one instance
        g.unsupported.discard("nvmlDeviceGetMigMode")
        g.mig_mode = 1
        g.migs = [FakeMig(MIG_A, gpu_instance_id=1)]
        await r.next_poll()
        assert g.calls["nvmlDeviceGetMigMode"] == asked  # not before the interval
        for _ in range(30):
            await r.next_poll()
        s = last(r, g.uuid)
        assert s.mig_mode is True
        assert s.mig_devices is not None and [m.uuid for m in s.mig_devices] == [MIG_A]


async def test_leaving_mig_mode_reads_utilisation_again() -> None:
    fake, _ = mig_node()
    async with running(fake) as r:  # type: ignore[arg-type]
        g = r.fake.gpus[1]
        await r.next_poll()
        assert last(r, g.uuid).utilization_ratio is None
        g.mig_mode, g.migs = 0, []
        await r.next_poll()  # mode change seen: NOT_SUPPORTED calls are probed again
        await r.next_poll()
        s = last(r, g.uuid)
        assert s.mig_mode is False and s.mig_devices == ()
        assert s.utilization_ratio == 0.7
