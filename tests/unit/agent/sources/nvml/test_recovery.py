"""NVML source: the recovery-action field and event, NVML_ERROR_RESET_REQUIRED, XID 154."""

from __future__ import annotations

import pynvml

from gpuhealth.agent.health import HealthEngine, HealthSettings
from gpuhealth.agent.observations import GpuSample, RecoveryActionObservation, XidObservation
from gpuhealth.agent.sources.nvml.device import NVML_FIELD_ERRORS
from tests.fakes.fake_pynvml import h100_node
from tests.support.wait import until
from tests.unit.agent.sources.nvml.test_source import running


def engine_states(r: object, engine: HealthEngine) -> dict[str, tuple[str, set[str]]]:
    for o in r.got:  # type: ignore[attr-defined]
        engine.observe(o)
    return {s.info.uuid: (s.state, {c.code for c in s.conditions}) for s in engine.statuses()}


async def test_recovery_field_is_read_every_poll_in_the_same_call_as_memory_temp() -> None:
    fake = h100_node(2)
    fake.gpus[1].recovery_action = pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT
    async with running(fake) as r:
        await r.next_poll()
        by_gpu = {s.uuid: s for s in r.of(GpuSample)}  # type: ignore[attr-defined]
        assert by_gpu[fake.gpus[0].uuid].recovery_action == 0
        assert by_gpu[fake.gpus[1].uuid].recovery_action == 2
        assert by_gpu[fake.gpus[1].uuid].memory_temperature_c == 50.0
        polls = r.source.polls.count
        assert fake.gpus[0].calls["nvmlDeviceGetFieldValues"] == polls
        states = engine_states(r, HealthEngine(HealthSettings(), r.clock))
        assert states[fake.gpus[1].uuid] == ("unhealthy", {"recovery-node-reboot"})
        assert states[fake.gpus[0].uuid] == ("healthy", set())


async def test_recovery_field_not_supported_is_absent_and_memtemp_still_read() -> None:
    fake = h100_node(1)
    fid = pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
    fake.gpus[0].field_errors[fid] = pynvml.NVML_ERROR_NOT_SUPPORTED  # pre-r570 driver
    async with running(fake) as r:
        await r.next_poll()
        samples = r.of(GpuSample)
        assert all(s.recovery_action is None for s in samples)  # type: ignore[attr-defined]
        assert all(s.memory_temperature_c == 50.0 for s in samples)  # type: ignore[attr-defined]
        assert r.source.counters.value(NVML_FIELD_ERRORS) == 0


async def test_reset_required_is_a_signal_not_a_counted_error() -> None:
    fake = h100_node(2)
    fake.gpus[0].errors = {
        "nvmlDeviceGetTemperature": pynvml.NVML_ERROR_RESET_REQUIRED,
        "nvmlDeviceGetUtilizationRates": pynvml.NVML_ERROR_RESET_REQUIRED,
    }
    async with running(fake) as r:
        await r.next_poll()
        by_gpu = {s.uuid: s for s in r.of(GpuSample)}  # type: ignore[attr-defined]
        bad, good = by_gpu[fake.gpus[0].uuid], by_gpu[fake.gpus[1].uuid]
        assert bad.reset_required is True and bad.temperature_c is None
        assert good.reset_required is False and good.temperature_c == 45.0
        assert r.source.counters.value(NVML_FIELD_ERRORS) == 0
        states = engine_states(r, HealthEngine(HealthSettings(), r.clock))
        assert states[fake.gpus[0].uuid] == ("unhealthy", {"reset-required"})
        # still asked next time (RESET_REQUIRED is not NOT_SUPPORTED)
        n = fake.gpus[0].calls["nvmlDeviceGetTemperature"]
        del fake.gpus[0].errors["nvmlDeviceGetTemperature"]
        await r.next_poll()
        assert fake.gpus[0].calls["nvmlDeviceGetTemperature"] == n + 1


async def test_recovery_event_reads_the_field_and_raises_at_once() -> None:
    fake = h100_node(2)
    async with running(fake) as r:
        fake.inject_recovery_action(1, pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET)
        await until(lambda: bool(r.of(RecoveryActionObservation)))
        (o,) = r.of(RecoveryActionObservation)
        assert isinstance(o, RecoveryActionObservation)
        assert (o.uuid, o.value, o.source) == (fake.gpus[1].uuid, 4, "nvml")
        # one sample of the field is not enough for the flag rule; the event decides
        got = [x for x in r.got if not isinstance(x, GpuSample)]
        engine = HealthEngine(HealthSettings(), r.clock)
        for x in got:
            engine.observe(x)
        states = {s.info.uuid: (s.state, {c.code for c in s.conditions}) for s in engine.statuses()}
        assert states[fake.gpus[1].uuid] == ("unhealthy", {"recovery-drain-and-reset"})


async def test_recovery_event_uses_its_data_when_the_field_cannot_be_read() -> None:
    fake = h100_node(1)
    async with running(fake) as r:
        fake.gpus[0].errors["nvmlDeviceGetFieldValues"] = pynvml.NVML_ERROR_UNKNOWN
        fake.inject_recovery_action(0, pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET)
        await until(lambda: bool(r.of(RecoveryActionObservation)))
        (o,) = r.of(RecoveryActionObservation)
        assert o.value == 1  # type: ignore[attr-defined]


async def test_nvml_xid_154_carries_the_recovery_action() -> None:
    """NVML's XID event has no message: the source reads the field, so XID 154 gets the
    driver's action whether NVML or the kernel log reports it first."""
    fake = h100_node(1)
    async with running(fake) as r:
        fake.gpus[0].recovery_action = pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT
        fake.inject_xid(0, 154)
        await until(lambda: bool(r.of(XidObservation)))
        (x,) = r.of(XidObservation)
        assert isinstance(x, XidObservation) and x.xid == 154
        assert x.message == "GPU recovery action (NVML) is 0x2 (Node Reboot Required)"
        engine = HealthEngine(HealthSettings(), r.clock)
        engine.observe(x)
        (status,) = engine.statuses()
        (cond,) = status.conditions
        assert (cond.code, cond.severity, cond.action) == ("xid-154", "unhealthy", "RESTART_BM")


async def test_other_xids_do_not_read_the_field() -> None:
    fake = h100_node(1)
    async with running(fake) as r:
        before = fake.gpus[0].calls["nvmlDeviceGetFieldValues"]
        polls = r.source.polls.count
        fake.inject_xid(0, 79)
        await until(lambda: bool(r.of(XidObservation)))
        (x,) = r.of(XidObservation)
        assert x.message == ""  # type: ignore[attr-defined]
        assert fake.gpus[0].calls["nvmlDeviceGetFieldValues"] - before == (
            r.source.polls.count - polls
        )
