"""localkube's pieces that need no Kubernetes binaries: PKI, object bodies, process control."""

from __future__ import annotations

import datetime
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from localkube import pki
from localkube.objects import gpu_node_body, pod_body
from localkube.process import LocalKubeError, ManagedProcess, PortInUse, ProbeSettings

FAST = ProbeSettings(timeout_s=2.0, interval_s=0.01)


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_pki_chain_and_identities(tmp_path: Path) -> None:
    files = pki.generate(tmp_path)
    ca = _cert(files.ca_cert)
    ca_key = ca.public_key()
    assert isinstance(ca_key, ec.EllipticCurvePublicKey)
    for leaf_path in (files.serving_cert, files.admin_cert):
        leaf = _cert(leaf_path)
        leaf.verify_directly_issued_by(ca)
        assert leaf.not_valid_after_utc > datetime.datetime.now(datetime.UTC)

    serving = _cert(files.serving_cert)
    sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in sans.get_values_for_type(x509.DNSName)
    assert "127.0.0.1" in [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)]
    eku = serving.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in eku

    admin = _cert(files.admin_cert)
    orgs = admin.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    assert [o.value for o in orgs] == ["system:masters"]
    assert (
        ExtendedKeyUsageOID.CLIENT_AUTH
        in admin.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    )
    assert files.admin_key.stat().st_mode & 0o077 == 0
    assert b"PUBLIC KEY" in files.sa_public_key.read_bytes()


def test_gpu_node_body_is_kwok_managed_with_gpus_in_status() -> None:
    node = gpu_node_body("n1", gpus=4, labels={"x": "y"})
    assert node["metadata"]["annotations"] == {"kwok.x-k8s.io/node": "fake"}
    assert node["metadata"]["labels"]["type"] == "kwok"
    assert node["metadata"]["labels"]["nvidia.com/gpu.present"] == "true"
    assert node["metadata"]["labels"]["x"] == "y"
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "4"
    assert node["status"]["allocatable"] == node["status"]["capacity"]

    plain = gpu_node_body("n2", kwok=False)
    assert plain["metadata"]["annotations"] == {}
    assert "type" not in plain["metadata"]["labels"]


@pytest.mark.parametrize(
    ("kwargs", "path", "expected"),
    [
        ({"node_name": "n1"}, ("spec", "nodeName"), "n1"),
        ({"service_account": "sa"}, ("spec", "serviceAccountName"), "sa"),
        ({"scheduler_name": "s"}, ("spec", "schedulerName"), "s"),
        ({"node_selector": {"a": "b"}}, ("spec", "nodeSelector"), {"a": "b"}),
    ],
)
def test_pod_body_fields(
    kwargs: dict[str, object], path: tuple[str, str], expected: object
) -> None:
    body = pod_body("p", **kwargs)  # type: ignore[arg-type]
    assert body[path[0]][path[1]] == expected


def test_pod_body_gpu_limit() -> None:
    container = pod_body("p", gpus=2)["spec"]["containers"][0]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "2"}}
    assert "resources" not in pod_body("p")["spec"]["containers"][0]


def _proc(tmp_path: Path, script: str) -> ManagedProcess:
    return ManagedProcess("toy", ["sh", "-c", script], tmp_path / "toy.log", tmp_path)


def test_process_that_dies_reports_its_log(tmp_path: Path) -> None:
    proc = _proc(tmp_path, "echo boom; exit 3")
    proc.start()
    with pytest.raises(LocalKubeError, match=r"(?s)exited with code 3.*boom") as failed:
        proc.wait_ready(lambda: False, FAST)
    assert not isinstance(failed.value, PortInUse)


def test_port_in_use_is_recognised(tmp_path: Path) -> None:
    proc = _proc(tmp_path, "echo 'listen tcp 127.0.0.1:1: bind: address already in use'; exit 1")
    proc.start()
    with pytest.raises(PortInUse):
        proc.wait_ready(lambda: False, FAST)


def test_stop_escalates_to_sigkill(tmp_path: Path) -> None:
    proc = _proc(tmp_path, "trap '' TERM; echo up; while :; do sleep 0.05; done")
    proc.start()
    proc.wait_ready(lambda: "up" in proc.log_tail(), FAST)
    began = time.monotonic()
    proc.stop(grace_s=0.2)
    assert proc.exited() is not None
    assert time.monotonic() - began < 1.0
    proc.stop()  # idempotent


def test_missing_binary_is_our_error(tmp_path: Path) -> None:
    proc = ManagedProcess("ghost", [str(tmp_path / "nope")], tmp_path / "g.log", tmp_path)
    with pytest.raises(LocalKubeError, match="cannot run ghost"):
        proc.start()
