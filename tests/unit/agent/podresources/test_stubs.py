"""The committed PodResources stubs match the local proto, and the proto matches kubelet v1."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuhealth.agent.podresources._pb import api_pb2

ROOT = Path(__file__).resolve().parents[4]
PROTO = ROOT / "src" / "gpuhealth" / "agent" / "podresources" / "api.proto"
PB = ROOT / "src" / "gpuhealth" / "agent" / "podresources" / "_pb"


def test_generated_stubs_are_current(tmp_path: Path) -> None:
    protoc = pytest.importorskip("grpc_tools.protoc")
    rc = protoc.main(
        [
            "protoc",
            f"-I{PROTO.parent}",
            f"--python_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            "api.proto",
        ]
    )
    assert rc == 0
    assert (tmp_path / "api_pb2.py").read_text() == (PB / "api_pb2.py").read_text(), (
        "run hack/gen-podresources.sh"
    )
    fresh = (
        (tmp_path / "api_pb2_grpc.py")
        .read_text()
        .replace("\nimport api_pb2 as api__pb2\n", "\nfrom . import api_pb2 as api__pb2\n")
    )
    assert fresh == (PB / "api_pb2_grpc.py").read_text(), "run hack/gen-podresources.sh"


@pytest.mark.parametrize(
    ("message", "fields"),
    [
        ("ListPodResourcesResponse", {"pod_resources": 1}),
        ("PodResources", {"name": 1, "namespace": 2, "containers": 3}),
        (
            "ContainerResources",
            {"name": 1, "devices": 2, "cpu_ids": 3, "memory": 4, "dynamic_resources": 5},
        ),
        ("ContainerDevices", {"resource_name": 1, "device_ids": 2, "topology": 3}),
        ("AllocatableResourcesResponse", {"devices": 1, "cpu_ids": 2, "memory": 3}),
    ],
)
def test_wire_field_numbers(message: str, fields: dict[str, int]) -> None:
    desc = api_pb2.DESCRIPTOR.message_types_by_name[message]
    assert {f.name: f.number for f in desc.fields} == fields


def test_service_is_kubelets() -> None:
    svc = api_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert svc.full_name == "v1.PodResourcesLister"
    assert {m.name for m in svc.methods} == {"List", "GetAllocatableResources", "Get"}


def _body(text: str) -> list[str]:
    """Proto lines from ``syntax`` on, without gogo.proto imports and options."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("syntax"))
    return [ln for ln in lines[start:] if "gogo" not in ln]


def test_local_proto_is_kubelets() -> None:
    upstream = Path.home() / "go/pkg/mod/k8s.io/kubelet@v0.36.3/pkg/apis/podresources/v1/api.proto"
    if not upstream.exists():
        pytest.skip("k8s.io/kubelet@v0.36.3 is not in the Go module cache")
    assert _body(PROTO.read_text()) == _body(upstream.read_text())
