"""NVML source: NVLink support tracked per (link, counter); NVLink5's per-link error fields."""

from __future__ import annotations

import pynvml

from gpuhealth.agent.observations import GpuSample
from tests.fakes.fake_pynvml import h100_node
from tests.unit.agent.sources.nvml.test_source import running


def last(r: object) -> GpuSample:
    s = r.of(GpuSample)[-1]  # type: ignore[attr-defined]
    assert isinstance(s, GpuSample)
    return s


async def test_one_unsupported_counter_hides_only_itself() -> None:
    fake = h100_node(1)
    g = fake.gpus[0]
    g.nvlink_error_per_counter = 3
    g.nvlink_unsupported = {(0, pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA)}
    async with running(fake, nvlink_every_polls=1) as r:
        await r.next_poll()
        s = last(r)
        assert (s.nvlink_links_up, s.nvlink_links_total) == (18, 18)
        assert s.nvlink_errors == (18 * 4 - 1) * 3
        # the unsupported pair is not asked again; every other pair is, every poll
        n = g.calls["nvmlDeviceGetNvLinkErrorCounter"]
        await r.next_poll()
        assert g.calls["nvmlDeviceGetNvLinkErrorCounter"] - n == 18 * 4 - 1
        g.nvlink_error_per_counter = 5
        await r.next_poll()
        assert last(r).nvlink_errors == (18 * 4 - 1) * 5  # errors still reported


async def test_a_link_without_legacy_counters_is_read_through_its_error_fields() -> None:
    """NVLink5 drivers answer NOT_SUPPORTED for the legacy counters of a link; the per-link
    DL replay / recovery / CRC fields (scope = link) still count."""
    fake = h100_node(1)
    g = fake.gpus[0]
    g.nvlink_states = [1] * 4
    g.nvlink_error_per_counter = 2
    g.nvlink_unsupported = {(1, c) for c in range(4)}
    async with running(fake, nvlink_every_polls=1) as r:
        await r.next_poll()
        # links 0, 2, 3: four legacy counters; link 1: three fields
        assert last(r).nvlink_errors == 3 * 4 * 2 + 3 * 2


async def test_no_error_source_at_all_is_absent_not_zero() -> None:
    fake = h100_node(1)
    g = fake.gpus[0]
    g.unsupported.add("nvmlDeviceGetNvLinkErrorCounter")
    g.nvlink_fields = False
    async with running(fake, nvlink_every_polls=1) as r:
        await r.next_poll()
        s = last(r)
        assert s.nvlink_errors is None and s.nvlink_links_up == 18


async def test_sparse_links_and_an_unsupported_link_state() -> None:
    fake = h100_node(1)
    g = fake.gpus[0]
    g.nvlink_states = [1, 0, 1, 1]
    g.nvlink_state_unsupported = {2}
    async with running(fake, nvlink_every_polls=1) as r:
        await r.next_poll()
        s = last(r)
        # link 2 is no link at all; link 3 after it still counts; link 1 is down
        assert (s.nvlink_links_up, s.nvlink_links_total) == (2, 3)
        assert s.nvlink_errors == 0


async def test_a_gpu_without_nvlink() -> None:
    fake = h100_node(1)
    fake.gpus[0].nvlink_states = []
    async with running(fake, nvlink_every_polls=1) as r:
        s = last(r)
        assert (s.nvlink_links_up, s.nvlink_links_total, s.nvlink_errors) == (None, None, None)
