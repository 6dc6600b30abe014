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


async def test_a_client_ca_asks_for_certificates_and_trusts_only_that_ca(tmp_path: Path) -> None:
    """``extender.client_ca_file``: a client presenting a certificate that CA signed is
    verified (its certificate visible to the route), one presenting none is served too (an
    agent), one presenting another CA's is refused at the handshake; the system's CAs are
    never trusted for client certificates."""
    server_ca, client_ca, other_ca = trustme.CA(), trustme.CA(), trustme.CA()
    _write_pair(server_ca, tmp_path, "v1")
    client_ca.cert_pem.write_to_path(str(tmp_path / "clients.crt"))
    ctx = server_ssl_context(
        str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"), str(tmp_path / "clients.crt")
    )
    assert ctx is not None and ctx.verify_mode is ssl.CERT_OPTIONAL
    assert len(ctx.get_ca_certs()) == 1  # that CA only, no system store
    seen: list[object] = []

    async def serve_one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(writer.get_extra_info("ssl_object").getpeercert())
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve_one, "127.0.0.1", 0, ssl=ctx)
    port = server.sockets[0].getsockname()[1]

    async def call(cert_from: trustme.CA | None) -> bytes:
        client = ssl.create_default_context()
        server_ca.configure_trust(client)
        if cert_from is not None:
            cert_from.issue_cert("kube-scheduler").configure_cert(client)
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client, server_hostname="localhost"
        )
        data = await reader.read()
        writer.close()
        return data

    try:
        assert await call(client_ca) == b"ok"
        assert await call(None) == b"ok"
        try:  # TLS 1.3: the server's refusal reaches the client after its handshake
            refused = await call(other_ca)
        except (ssl.SSLError, ConnectionError):
            refused = b""
        assert refused == b""
    finally:
        server.close()
    assert len(seen) == 2 and seen[0] and not seen[1]  # the verified one, none; never the other


def test_a_client_ca_without_tls_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="client certificates need TLS"):
        server_ssl_context(None, None, str(tmp_path / "ca.crt"))
