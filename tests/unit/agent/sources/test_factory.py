"""The configured sources are built (lazily importing each source module)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuhealth.agent.settings import load_config
from tests.support.clock import FakeClock


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        ({"source": "sim", "kmsg_path": "none"}, ["sim", "rdma"]),
        ({"source": "sim", "kmsg_path": "/dev/kmsg"}, ["sim", "kmsg", "rdma"]),
        ({"source": "nvml", "kmsg_path": "none"}, ["nvml", "rdma"]),
        ({"source": "dcgm-exporter", "kmsg_path": "/tmp/k"}, ["dcgm", "kmsg", "rdma"]),
        ({"source": "sim", "kmsg_path": "none", "rdma": {"enabled": False}}, ["sim"]),
    ],
)
def test_build_sources(overrides: dict[str, object], names: list[str]) -> None:
    from gpuhealth.agent.sources.factory import build_sources

    cfg = load_config(None, {"node_name": "n", **overrides})
    sources = build_sources(cfg, FakeClock())
    assert [s.name for s in sources] == names


def test_build_sources_loads_the_scenario(tmp_path: Path) -> None:
    from gpuhealth.agent.sources.factory import build_sources

    path = tmp_path / "s.yaml"
    path.write_text("name: t\ngpus: 3\n")
    cfg = load_config(None, {"node_name": "n", "source": "sim", "sim_scenario": str(path)})
    sim = build_sources(cfg, FakeClock())[0]
    assert len(sim.inventory().gpus) == 3  # type: ignore[attr-defined]


def test_the_rdma_source_reads_the_configured_sysfs_and_the_engines_gpus() -> None:
    from gpuhealth.agent.observations import PciAddress
    from gpuhealth.agent.sources.factory import build_sources
    from gpuhealth.agent.sources.rdma.source import RdmaSource

    cfg = load_config(None, {"node_name": "n", "source": "sim", "kmsg_path": "none",
                             "rdma": {"sysfs_root": "/host/sys"}})  # fmt: skip
    gpu = PciAddress(0, 0x1B, 0, 0)
    rdma = build_sources(cfg, FakeClock(), gpus=lambda: [gpu])[-1]
    assert isinstance(rdma, RdmaSource)
    assert str(rdma.root) == "/host/sys" and rdma._gpus() == [gpu]
