"""/proc/<pid>/cgroup parsing on real-format lines (cgroup v1 and v2, both drivers)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.agent.cgroup import CgroupOwner, parse_cgroup_path, parse_proc_cgroup, read_owner

UID = "8f2c1d3e-4b5a-4c6d-9e7f-0a1b2c3d4e5f"
UID_ = UID.replace("-", "_")
CID = "3e5a1b7c9d2f4e6a8b0c1d3e5f7a9b2c4d6e8f0a1b3c5d7e9f2a4b6c8d0e1f3a"

V2_SYSTEMD_CONTAINERD = (
    f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
    f"cri-containerd-{CID}.scope\n"
)
V2_SYSTEMD_CRIO_GUARANTEED = f"0::/kubepods.slice/kubepods-pod{UID_}.slice/crio-{CID}.scope\n"
V1_CGROUPFS_DOCKER = f"""12:pids:/kubepods/besteffort/pod{UID}/{CID}
11:hugetlb:/kubepods/besteffort/pod{UID}/{CID}
10:memory:/kubepods/besteffort/pod{UID}/{CID}
9:cpu,cpuacct:/kubepods/besteffort/pod{UID}/{CID}
1:name=systemd:/kubepods/besteffort/pod{UID}/{CID}
0::/
"""
_SYSTEMD_PATH = (
    f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/"
    f"docker-{CID}.scope"
)
V1_SYSTEMD = f"""11:devices:{_SYSTEMD_PATH}
4:memory:{_SYSTEMD_PATH}
1:name=systemd:{_SYSTEMD_PATH}
"""
V2_NESTED_KIND = (
    f"0::/system.slice/docker-{'a' * 64}.scope/kubelet.slice/kubelet-kubepods.slice/"
    f"kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UID_}.slice/"
    f"cri-containerd-{CID}.scope\n"
)
V2_CGROUPNS_RELATIVE = f"0::/../../kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope\n"
HOST_PROCESS = "0::/system.slice/nvidia-persistenced.service\n"
CONMON = (
    f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
    f"crio-conmon-{CID}.scope\n"
)
POD_LEVEL = f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice\n"
DOCKER_NOT_K8S = f"0::/system.slice/docker-{CID}.scope\n"


@pytest.mark.parametrize(
    ("name", "text", "want"),
    [
        ("v2 systemd containerd", V2_SYSTEMD_CONTAINERD, CgroupOwner(UID, CID)),
        ("v2 systemd cri-o guaranteed", V2_SYSTEMD_CRIO_GUARANTEED, CgroupOwner(UID, CID)),
        ("v1 cgroupfs docker", V1_CGROUPFS_DOCKER, CgroupOwner(UID, CID)),
        ("v1 systemd docker", V1_SYSTEMD, CgroupOwner(UID, CID)),
        ("kind: kubelet slices nested in docker", V2_NESTED_KIND, CgroupOwner(UID, CID)),
        ("private cgroup namespace", V2_CGROUPNS_RELATIVE, CgroupOwner(UID, CID)),
        ("pod-level cgroup", POD_LEVEL, CgroupOwner(UID, None)),
        ("host daemon", HOST_PROCESS, None),
        ("conmon is not the container", CONMON, None),
        ("plain docker container", DOCKER_NOT_K8S, None),
        ("empty", "", None),
        ("garbage", "no colons here\n::\n", None),
    ],
)
def test_parse_proc_cgroup(name: str, text: str, want: CgroupOwner | None) -> None:
    assert parse_proc_cgroup(text) == want, name


def test_uid_is_canonical_lowercase() -> None:
    owner = parse_cgroup_path(f"/kubepods/pod{UID.upper()}/{CID}")
    assert owner == CgroupOwner(UID, CID)


def test_read_owner_from_proc_tree(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text(V2_SYSTEMD_CONTAINERD)
    assert read_owner(42, tmp_path) == CgroupOwner(UID, CID)
    assert read_owner(43, tmp_path) is None


@given(st.text(max_size=300))
def test_parser_never_crashes(text: str) -> None:
    owner = parse_proc_cgroup(text)
    assert owner is None or "-" in owner.pod_uid
