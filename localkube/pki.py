"""Throw-away PKI for a local control plane: one CA, serving and client certs, SA keys.

Everything is written as PEM files into one directory; nothing here is meant to be
secure beyond a test run (short-lived, 127.0.0.1 only).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CERT_VALIDITY = datetime.timedelta(days=2)
"""Certificates outlive any test session or demo run, and nothing longer."""

_SERVING_SANS: tuple[x509.GeneralName, ...] = (
    x509.DNSName("localhost"),
    x509.DNSName("kubernetes"),
    x509.DNSName("kubernetes.default"),
    x509.DNSName("kubernetes.default.svc"),
    x509.DNSName("kubernetes.default.svc.cluster.local"),
    x509.IPAddress(ipaddress.IPv4Address("127.0.0.1")),
    x509.IPAddress(ipaddress.IPv4Address("10.0.0.1")),
)


@dataclass(frozen=True)
class Pki:
    """Paths of the PEM files the control plane and its clients use."""

    ca_cert: Path
    ca_key: Path
    """Signs further client certificates (:func:`client_cert`), e.g. a kubelet's."""
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_public_key: Path
    sa_private_key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + CERT_VALIDITY)
    )


def _leaf(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_name: x509.Name,
    subject: x509.Name,
    usage: x509.ObjectIdentifier,
    sans: tuple[x509.GeneralName, ...] = (),
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    builder = (
        _builder(subject, ca_name, key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def generate(directory: Path, extra_ips: tuple[str, ...] = ()) -> Pki:
    """Create the CA, apiserver serving cert, admin client cert and SA signing keys.

    ``extra_ips`` are added to the serving certificate (an apiserver reachable beyond
    127.0.0.1, e.g. from pods of a real node).
    """
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localkube-ca")])
    ca_cert = (
        _builder(ca_name, ca_name, ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    serving, serving_key = _leaf(
        ca_key,
        ca_name,
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]),
        ExtendedKeyUsageOID.SERVER_AUTH,
        _SERVING_SANS
        + tuple(x509.IPAddress(ipaddress.IPv4Address(ip)) for ip in extra_ips if ip != "127.0.0.1"),
    )
    admin, admin_key = _leaf(
        ca_key,
        ca_name,
        x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
                x509.NameAttribute(NameOID.COMMON_NAME, "localkube-admin"),
            ]
        ),
        ExtendedKeyUsageOID.CLIENT_AUTH,
    )
    # ServiceAccount tokens are signed with RS256 by default; an RSA key keeps every
    # consumer (including JWKS readers) happy.
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pki = Pki(
        ca_cert=directory / "ca.crt",
        ca_key=directory / "ca.key",
        serving_cert=directory / "apiserver.crt",
        serving_key=directory / "apiserver.key",
        admin_cert=directory / "admin.crt",
        admin_key=directory / "admin.key",
        sa_public_key=directory / "sa.pub",
        sa_private_key=directory / "sa.key",
    )
    _write_cert(pki.ca_cert, ca_cert)
    _write_key(pki.ca_key, ca_key)
    _write_cert(pki.serving_cert, serving)
    _write_key(pki.serving_key, serving_key)
    _write_cert(pki.admin_cert, admin)
    _write_key(pki.admin_key, admin_key)
    _write_key(pki.sa_private_key, sa_key)
    pki.sa_public_key.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pki


def client_cert(pki: Pki, cert: Path, key: Path, common_name: str, *groups: str) -> None:
    """A client certificate signed by ``pki``'s CA: user ``common_name`` in ``groups``
    (e.g. ``system:node:<name>`` in ``system:nodes`` for a kubelet)."""
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TypeError(f"{pki.ca_key} is not an EC key")
    ca_name = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes()).subject
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
    subject = x509.Name([*attrs, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    leaf, leaf_key = _leaf(ca_key, ca_name, subject, ExtendedKeyUsageOID.CLIENT_AUTH)
    _write_cert(cert, leaf)
    _write_key(key, leaf_key)
