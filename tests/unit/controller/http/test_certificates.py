"""The certificate the controller keeps itself (controller/http/certificates.py), the pure and
file parts: what it issues verifies as TLS does, when it is renewed, the Secret's data round
trip, the files replaced whole."""

from __future__ import annotations

import asyncio
import datetime
import ssl
from pathlib import Path

import pytest

from gpuhealth.common.config import SettingError
from gpuhealth.controller.http.certificates import (
    KeptCertificate,
    issue_ca,
    issue_serving,
    names_match,
    renewal_due,
    write_pair,
)
from gpuhealth.controller.http.settings import TlsSettings

NOW = datetime.datetime(2026, 11, 22, 10, 0, tzinfo=datetime.UTC)
NAMES = ("gh-controller", "gh-controller.ns", "gh-controller.ns.svc", "localhost")


async def test_the_issued_certificate_verifies_for_the_services_names(tmp_path: Path) -> None:
    """A client that trusts only the CA verifies the serving certificate for each name, and
    refuses it for another name."""
    ca = issue_ca("gh CA", datetime.datetime.now(datetime.UTC), 10)
    pair = issue_serving(ca, NAMES, datetime.datetime.now(datetime.UTC), 2)
    assert write_pair(pair, str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))
    (tmp_path / "ca.crt").write_bytes(ca.cert)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")

    async def served(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(served, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    client = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    try:
        for name in ("gh-controller.ns.svc", "localhost"):
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=client, server_hostname=name
            )
            assert await reader.read() == b"ok"
            writer.close()
        with pytest.raises(ssl.SSLCertVerificationError):
            await asyncio.open_connection(
                "127.0.0.1", port, ssl=client, server_hostname="gh-controller.other.svc"
            )
    finally:
        server.close()


@pytest.mark.parametrize(
    ("left_days", "due"), [(365, False), (31, False), (30, True), (1, True), (-1, True)]
)
def test_renewal_is_due_within_renew_before(left_days: int, due: bool) -> None:
    end = NOW + datetime.timedelta(days=left_days)
    assert renewal_due(end, NOW, 30 * 86400) is due


def test_the_serving_certificate_is_bounded_by_its_ca_and_names_its_names() -> None:
    ca = issue_ca("gh CA", NOW, 10)
    pair = issue_serving(ca, NAMES, NOW, 365)
    assert pair.not_after <= ca.not_after  # never outlives its CA
    assert names_match(pair, NAMES) and names_match(pair, tuple(reversed(NAMES)))
    assert not names_match(pair, NAMES[:2])  # a Service renamed: a new certificate


def test_the_secrets_data_round_trips_and_a_broken_one_reads_as_none() -> None:
    ca = issue_ca("gh CA", NOW, 10)
    kept = KeptCertificate(ca, issue_serving(ca, NAMES, NOW, 5))
    data = kept.data()
    assert set(data) == {"tls.crt", "tls.key", "ca.crt", "ca.key"}
    assert KeptCertificate.from_data(data) == kept
    assert KeptCertificate.from_data({k: v for k, v in data.items() if k != "ca.key"}) is None
    assert KeptCertificate.from_data({**data, "tls.crt": "not base64!"}) is None


def test_the_files_are_replaced_whole_and_only_when_they_change(tmp_path: Path) -> None:
    ca = issue_ca("gh CA", NOW, 10)
    first, second = (issue_serving(ca, NAMES, NOW, 5) for _ in range(2))
    cert, key = str(tmp_path / "tls.crt"), str(tmp_path / "tls.key")
    assert write_pair(first, cert, key)
    inode = (tmp_path / "tls.crt").stat().st_ino
    assert not write_pair(first, cert, key)  # the same pair: untouched
    assert (tmp_path / "tls.crt").stat().st_ino == inode
    assert write_pair(second, cert, key)
    assert (tmp_path / "tls.crt").stat().st_ino != inode  # renamed into place
    assert (tmp_path / "tls.key").read_bytes() == second.key
    assert (tmp_path / "tls.key").stat().st_mode & 0o077 == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tls.crt", "tls.key"]


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"secret": "s"}, "names"),
        ({"secret": "s", "names": ("a",), "ca_file": "/ca"}, "ca_file"),
        ({"ca_file": "/ca"}, "ca_file"),
        ({"validity_days": 30, "renew_before_days": 30}, "renew_before_days"),
    ],
)
def test_contradictory_tls_settings_are_refused(fields: dict[str, object], error: str) -> None:
    with pytest.raises(SettingError) as exc:
        TlsSettings(**fields).check()  # type: ignore[arg-type]
    assert exc.value.field == error


def test_a_long_first_name_still_issues_a_certificate_that_names_it_whole() -> None:
    """X.509 bounds a common name at 64 characters; a Service name in a long namespace is
    longer (the real API server test found it): the subject is cut, the names are whole."""
    long_names = ("gpuhealth-controller." + "a" * 60 + ".svc", "localhost")
    pair = issue_serving(issue_ca("gh CA", NOW, 10), long_names, NOW, 5)
    assert names_match(pair, long_names)
