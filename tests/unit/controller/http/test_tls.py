"""The controller's TLS: orders never on a plaintext listener, and a renewed certificate
served to new connections without a restart (controller/http/tls.py)."""

from __future__ import annotations

import asyncio
import os
import ssl
from pathlib import Path

import pytest
import trustme

from gpuhealth.common.errors import ConfigError
from gpuhealth.controller.cli import serve
from gpuhealth.controller.http.tls import (
    CertificateReloader,
    check_orders_are_encrypted,
    server_ssl_context,
)
from gpuhealth.controller.remediation.settings import RemediationSettings
from gpuhealth.controller.settings import ControllerSettings


def _write_pair(
    ca: trustme.CA, directory: Path, name: str, key_from: trustme.CA | None = None
) -> None:
    """Write a certificate for localhost (signed by ``ca``) and a key as a kubelet does: new
    files, then a rename over the old ones. ``key_from`` writes another pair's key."""
    cert = ca.issue_cert("localhost")
    key = (key_from.issue_cert("localhost") if key_from else cert).private_key_pem
    directory.mkdir(parents=True, exist_ok=True)
    tmp_cert, tmp_key = directory / f".{name}.crt", directory / f".{name}.key"
    cert.cert_chain_pems[0].write_to_path(str(tmp_cert))
    key.write_to_path(str(tmp_key))
    os.replace(tmp_cert, directory / "tls.crt")
    os.replace(tmp_key, directory / "tls.key")


def _cfg(tmp_path: Path, remediation: RemediationSettings | None = None) -> ControllerSettings:
    return ControllerSettings(
        tls_cert_file=str(tmp_path / "tls.crt"),
        tls_key_file=str(tmp_path / "tls.key"),
        remediation=remediation or RemediationSettings(),
    )


def test_orders_are_refused_on_a_plaintext_listener() -> None:
    with pytest.raises(ConfigError, match="must not be plaintext"):
        check_orders_are_encrypted(True, None, allow_plaintext=False)
    check_orders_are_encrypted(True, None, allow_plaintext=True)
    check_orders_are_encrypted(False, None, allow_plaintext=False)  # the loop off: nothing to send


def test_orders_are_allowed_over_tls(tmp_path: Path) -> None:
    _write_pair(trustme.CA(), tmp_path, "a")
    cfg = _cfg(tmp_path, remediation=RemediationSettings(enabled=True))
    ctx = server_ssl_context(cfg.tls_cert_file, cfg.tls_key_file)
    check_orders_are_encrypted(cfg.remediation.enabled, ctx, allow_plaintext=False)


async def test_the_controller_refuses_to_serve_orders_in_plaintext_before_anything_else() -> None:
    cfg = ControllerSettings(
        kubeconfig="/nonexistent", remediation=RemediationSettings(enabled=True)
    )
    with pytest.raises(ConfigError, match=r"remediation\.enabled: .* must not be plaintext"):
        await serve(cfg)


async def _served_by(port: int, ca: trustme.CA) -> bool:
    """Does the server on ``port`` present a certificate ``ca`` signed?"""
    client = ssl.create_default_context()
    ca.configure_trust(client)
    try:
        _, writer = await asyncio.open_connection("localhost", port, ssl=client)
    except ssl.SSLCertVerificationError:
        return False
    writer.close()
    return True


async def test_a_renewed_certificate_is_served_without_a_restart(tmp_path: Path) -> None:
    first, second, third = trustme.CA(), trustme.CA(), trustme.CA()
    _write_pair(first, tmp_path, "a")
    cfg = _cfg(tmp_path)
    ctx = server_ssl_context(cfg.tls_cert_file, cfg.tls_key_file)
    assert ctx is not None
    reloader = CertificateReloader(ctx, str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))

    async def answer(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.close()

    server = await asyncio.start_server(answer, "localhost", 0, ssl=ctx)
    port = server.sockets[0].getsockname()[1]
    try:
        assert await _served_by(port, first)
        assert not reloader.check()  # nothing changed
        _write_pair(second, tmp_path, "b")
        assert reloader.check()
        assert await _served_by(port, second)
        assert not await _served_by(port, first)
        # A pair that does not match (a key from elsewhere) is not loaded: the last good one stays.
        _write_pair(third, tmp_path, "c", key_from=second)
        assert not reloader.check()
        assert await _served_by(port, second)
        assert reloader.reloads == 1
    finally:
        server.close()
        await server.wait_closed()
