"""``gpuhealth-controller --tls-cert-file/--tls-key-file`` serves HTTPS that agents can verify."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
import trustme

from localkube import ControlPlane
from localkube.process import free_port
from tests.support.wait import until

pytestmark = pytest.mark.integration


async def test_controller_serves_https_with_the_given_certificate(
    control_plane: ControlPlane, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "tls.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "tls.key"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "tls.crt"))
    cfg = tmp_path / "controller.yaml"
    cfg.write_text(f"leader:\n  namespace: default\n  lease_name: {unique_name('tls')}\n")
    port = free_port()
    log = (tmp_path / "controller.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "gpuhealth.controller.cli",
            "--kubeconfig", str(control_plane.kubeconfig),
            "--listen", f"127.0.0.1:{port}",
            "--config", str(cfg),
            "--tls-cert-file", str(tmp_path / "tls.crt"),
            "--tls-key-file", str(tmp_path / "tls.key"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
        env={**os.environ, "PYTHONPATH": str(Path.cwd())},
    )  # fmt: skip
    trusted = ssl.create_default_context()
    ca.configure_trust(trusted)
    try:
        async with aiohttp.ClientSession() as s:

            async def healthy() -> bool | None:
                try:
                    async with s.get(f"https://127.0.0.1:{port}/healthz", ssl=trusted) as r:
                        return True if r.status == 200 else None
                except aiohttp.ClientConnectionError:
                    return None

            await until(healthy, "HTTPS /healthz 200", timeout_s=30)
            # A client that does not trust the CA is refused: agents verify the controller.
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                async with s.get(
                    f"https://127.0.0.1:{port}/healthz", ssl=ssl.create_default_context()
                ):
                    pass
            # Plain HTTP on the TLS port does not get an answer.
            with pytest.raises(aiohttp.ClientError):
                async with s.get(f"http://127.0.0.1:{port}/healthz") as r:
                    await r.read()
    finally:
        proc.terminate()
        assert proc.wait(timeout=20) == 0, (tmp_path / "controller.log").read_text()[-3000:]
        log.close()


def test_certificate_without_key_is_a_config_error(tmp_path: Path) -> None:
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    out = subprocess.run(
        [sys.executable, "-m", "gpuhealth.controller.cli", "--tls-cert-file", str(cert)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path.cwd())},
        check=False,
    )
    assert out.returncode == 2
    assert "--tls-cert-file and --tls-key-file must be given together" in out.stderr
