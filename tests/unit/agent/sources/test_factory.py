"""The configured sources are built (lazily importing each source module)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuhealth.agent.settings import load_config
from tests.support.clock import FakeClock


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        # the simulator reads no host NIC unless a sysfs root is given (its scenario's NICs)
        ({"source": "sim", "kmsg_path": "none"}, ["sim"]),
        ({"source": "sim", "kmsg_path": "/dev/kmsg"}, ["sim", "kmsg"]),
        ({"source": "sim", "kmsg_path": "none", "rdma": {"sysfs_root": "/tmp/s"}}, ["sim", "rdma"]),
        ({"source": "nvml", "kmsg_path": "none"}, ["nvml", "rdma"]),
        ({"source": "dcgm-exporter", "kmsg_path": "/tmp/k"}, ["dcgm", "kmsg", "rdma"]),
        ({"source": "nvml", "kmsg_path": "none", "rdma": {"enabled": False}}, ["nvml"]),
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


@pytest.mark.parametrize(
    ("source", "given", "root"),
    [
        ("nvml", None, "/sys"),
        ("dcgm-exporter", None, "/sys"),
        ("sim", None, None),
        ("sim", "/tmp/tree", "/tmp/tree"),
        ("nvml", "/host/sys", "/host/sys"),
    ],
)
def test_the_nics_read_follow_the_gpu_source(
    source: str, given: str | None, root: str | None
) -> None:
    from gpuhealth.agent.sources.factory import build_sources

    rdma = {} if given is None else {"sysfs_root": given}
    cfg = load_config(None, {"node_name": "n", "source": source, "kmsg_path": "none", "rdma": rdma})
    assert cfg.rdma.root_for(cfg.source) == root
    built = [s for s in build_sources(cfg, FakeClock()) if s.name == "rdma"]
    assert [str(s.root) for s in built] == ([] if root is None else [root])  # type: ignore[attr-defined]
