"""The controller's own certificate, kept in the API server, and the CA agents trust, published.

**Kept** (``tls.secret``; the chart's ``controller.tls.generatedBy: controller``, the mode that
survives ``helm template``, Argo CD and Flux): the controller keeps its CA and serving
certificate in a Secret it creates once, when absent, and no deploy ever renders or
regenerates; every replica serves the pair that Secret holds.

- :func:`issue_ca`, :func:`issue_serving`: an ECDSA P-256 CA, and a serving certificate it
  signs for the Service's names (``tls.names``).
- :class:`CertificateKeeper`: at start (before the listener), the Secret read, or created with a
  new pair (create-if-absent: two replicas starting together race, the loser reads the
  winner's); the pair written, renamed into place, to the files the listener serves
  (``tls_cert_file``, ``tls_key_file``: an emptyDir); then every ``tls.check_interval_s`` the
  Secret read again (another replica's renewal, or an operator who deleted it to rotate: a new
  pair then) and the serving certificate renewed by whichever replica sees it within
  ``tls.renew_before_days`` of its end (the CA kept: agents need nothing new). The listener's
  reloader (:mod:`gpuhealth.controller.http.tls`) hands new connections the new pair.

**Published** (``tls.ca_configmap``): the CA agents mount, in a ConfigMap that holds nothing
else (a GPU node's kubelet can read every Secret its pods mount, so an agent never mounts the
one with the controller's key): the kept Secret's CA, or the CA file of a certificate mounted
from elsewhere (``tls.ca_file``: cert-manager's Secret, the user's), created when absent and
patched when it differs. :func:`renewal_due` and :func:`ca_configmap_body` are pure.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import os
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gpuhealth.common.clock import Clock
from gpuhealth.common.errors import ConfigError, GpuHealthError
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.http.settings import TlsSettings
from gpuhealth.controller.kube.rest import (
    MERGE_PATCH,
    ApiClient,
    ConflictError,
    NotFoundError,
    request,
)
from gpuhealth.controller.names import CONTROLLER, MANAGED_BY_LABEL

log = get_logger("controller.certificates")

CA_KEY = "ca.crt"
"""The key agents read the CA from (``--controller-ca-file .../ca.crt``), in the Secret and
in the ConfigMap."""
CA_PRIVATE_KEY = "ca.key"
"""The CA's private key, kept in the Secret only (to renew the serving certificate)."""
REQUEST_TIMEOUT_S = 10.0
CA_NAME = "gpuhealth controller CA"
MAX_COMMON_NAME = 64
"""X.509's bound on a common name: the serving certificate's subject is its first name cut
there (clients check the alternative names, which hold every name whole)."""


@dataclass(frozen=True, slots=True)
class Pair:
    """A certificate and its private key, PEM."""

    cert: bytes
    key: bytes

    @property
    def not_after(self) -> datetime.datetime:
        return x509.load_pem_x509_certificate(self.cert).not_valid_after_utc


@dataclass(frozen=True, slots=True)
class KeptCertificate:
    """What the Secret holds: the CA (with its key) and the serving pair it signed."""

    ca: Pair
    serving: Pair

    def data(self) -> dict[str, str]:
        """The Secret's ``data`` (base64)."""
        raw = {
            "tls.crt": self.serving.cert,
            "tls.key": self.serving.key,
            CA_KEY: self.ca.cert,
            CA_PRIVATE_KEY: self.ca.key,
        }
        return {k: base64.b64encode(v).decode() for k, v in raw.items()}

    @staticmethod
    def from_data(data: Mapping[str, str]) -> KeptCertificate | None:
        """None when a key is missing or not base64 (the Secret is then replaced)."""
        try:
            raw = {k: base64.b64decode(data[k], validate=True) for k in _KEYS}
        except (KeyError, ValueError, TypeError):
            return None
        return KeptCertificate(
            ca=Pair(raw[CA_KEY], raw[CA_PRIVATE_KEY]), serving=Pair(raw["tls.crt"], raw["tls.key"])
        )


_KEYS = ("tls.crt", "tls.key", CA_KEY, CA_PRIVATE_KEY)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def issue_ca(common_name: str, now: datetime.datetime, days: int) -> Pair:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Pair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue_serving(ca: Pair, names: Sequence[str], now: datetime.datetime, days: int) -> Pair:
    """A serving certificate for ``names`` (the first is its subject), signed by ``ca``."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert)
    ca_key = serialization.load_pem_private_key(ca.key, None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ConfigError("the kept CA key is not an ECDSA key")
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0][:MAX_COMMON_NAME])])
        )
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(min(now + datetime.timedelta(days=days), ca_cert.not_valid_after_utc))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return Pair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def renewal_due(
    not_after: datetime.datetime, now: datetime.datetime, renew_before_s: float
) -> bool:
    """Is the serving certificate within ``renew_before_s`` of its end (or past it)?"""
    return now >= not_after - datetime.timedelta(seconds=renew_before_s)


def names_match(pair: Pair, names: Sequence[str]) -> bool:
    """Does the serving certificate name exactly ``names`` (a changed Service name or
    namespace asks for a new one)?"""
    cert = x509.load_pem_x509_certificate(pair.cert)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    return sorted(san.get_values_for_type(x509.DNSName)) == sorted(names)


def ca_configmap_body(name: str, ca_pem: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {MANAGED_BY_LABEL: CONTROLLER}},
        "data": {CA_KEY: ca_pem},
    }


def write_pair(pair: Pair, cert_file: str, key_file: str) -> bool:
    """Write the pair where the listener reads it, each file renamed into place (a reader never
    sees half a file); False when the files already hold it."""
    cert_path, key_path = Path(cert_file), Path(key_file)
    try:
        if cert_path.read_bytes() == pair.cert and key_path.read_bytes() == pair.key:
            return False
    except OSError:
        pass
    for path, content, mode in ((key_path, pair.key, 0o600), (cert_path, pair.cert, 0o644)):
        tmp = path.with_name(f".{path.name}.new")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as out:
            out.write(content)
        os.replace(tmp, path)
    return True


class CertificateError(GpuHealthError):
    """The kept certificate could not be read or stored (the API server refused it)."""


class CaPublisher:
    """Keeps the CA agents trust in the ConfigMap ``name`` (``ca.crt``): created when absent,
    patched when it differs, left alone when it holds it."""

    def __init__(self, api: ApiClient, namespace: str, name: str) -> None:
        self._api = api
        self._path = f"/api/v1/namespaces/{quote(namespace)}/configmaps"
        self._name = name
        self.published = ""
        self.writes = 0
        """ConfigMap writes (created or patched)."""

    async def publish(self, ca_pem: str) -> bool:
        """True when the ConfigMap was written. Read every time (someone may have deleted it,
        e.g. Helm when the chart stopped rendering it)."""
        path = f"{self._path}/{quote(self._name)}"
        try:
            current = await request(self._api, "GET", path, timeout_s=REQUEST_TIMEOUT_S)
        except NotFoundError:
            body = ca_configmap_body(self._name, ca_pem)
            try:
                await request(self._api, "POST", self._path, body=body, timeout_s=REQUEST_TIMEOUT_S)
            except ConflictError:
                return False  # another replica created it: compared on the next pass
            self.published = ca_pem
            self.writes += 1
            log.info("controller_ca_published", configmap=self._name, created=True)
            return True
        if (current.get("data") or {}).get(CA_KEY) == ca_pem:
            self.published = ca_pem
            return False
        await request(
            self._api,
            "PATCH",
            path,
            body={"data": {CA_KEY: ca_pem}},
            content_type=MERGE_PATCH,
            timeout_s=REQUEST_TIMEOUT_S,
        )
        self.published = ca_pem
        self.writes += 1
        log.info("controller_ca_published", configmap=self._name, created=False)
        return True


class CertificateKeeper:
    """The kept certificate (``tls.secret``) and its files, and the CA published from it or
    from ``tls.ca_file`` (see the module docstring)."""

    def __init__(
        self,
        settings: TlsSettings,
        api: ApiClient,
        namespace: str,
        *,
        cert_file: str,
        key_file: str,
        clock: Clock,
    ) -> None:
        self.s = settings
        self._api = api
        self._namespace = namespace
        self._cert_file = cert_file
        self._key_file = key_file
        self._clock = clock
        self._path = f"/api/v1/namespaces/{quote(namespace)}/secrets"
        self.publisher = (
            CaPublisher(api, namespace, settings.ca_configmap) if settings.ca_configmap else None
        )
        self.kept: KeptCertificate | None = None
        self.created = 0
        self.renewed = 0
        self.failed_checks = 0

    def _new(self, ca: Pair | None = None) -> KeptCertificate:
        now = self._clock.now()
        ca = ca or issue_ca(CA_NAME, now, self.s.ca_validity_days)
        return KeptCertificate(ca, issue_serving(ca, self.s.names, now, self.s.validity_days))

    def _secret(self, kept: KeptCertificate, resource_version: str = "") -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.s.secret, "labels": {MANAGED_BY_LABEL: CONTROLLER}}
        if resource_version:
            meta["resourceVersion"] = resource_version
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": meta,
            "data": kept.data(),
        }

    async def _read(self) -> tuple[KeptCertificate | None, str] | None:
        """(what the Secret holds, its resourceVersion); None when there is no Secret."""
        try:
            obj = await request(
                self._api,
                "GET",
                f"{self._path}/{quote(self.s.secret)}",
                timeout_s=REQUEST_TIMEOUT_S,
            )
        except NotFoundError:
            return None
        meta = obj.get("metadata") or {}
        return KeptCertificate.from_data(obj.get("data") or {}), str(meta.get("resourceVersion"))

    async def ensure(self) -> KeptCertificate:
        """The kept certificate: read, created once when absent, renewed when due (or when it
        no longer names the Service); its files written."""
        for _ in range(5):
            found = await self._read()
            if found is None:
                fresh = self._new()
                try:
                    await request(
                        self._api,
                        "POST",
                        self._path,
                        body=self._secret(fresh),
                        timeout_s=REQUEST_TIMEOUT_S,
                    )
                except ConflictError:
                    continue  # another replica created it first: take theirs
                self.created += 1
                log.warning("controller_certificate_created", secret=self.s.secret)
                return self._adopt(fresh)
            kept, version = found
            if kept is not None and not self._needs_new(kept):
                return self._adopt(kept)
            fresh = self._new(kept.ca if kept is not None else None)
            try:
                await request(
                    self._api,
                    "PUT",
                    f"{self._path}/{quote(self.s.secret)}",
                    body=self._secret(fresh, version),
                    timeout_s=REQUEST_TIMEOUT_S,
                )
            except ConflictError:
                continue  # another replica renewed it meanwhile
            self.renewed += 1
            log.warning(
                "controller_certificate_renewed",
                secret=self.s.secret,
                unreadable=kept is None,
                not_after=fresh.serving.not_after.isoformat(),
            )
            return self._adopt(fresh)
        raise CertificateError(f"Secret {self.s.secret}: kept changing under the controller")

    def _needs_new(self, kept: KeptCertificate) -> bool:
        try:
            due = renewal_due(
                kept.serving.not_after, self._clock.now(), self.s.renew_before_days * 86400
            )
            return due or not names_match(kept.serving, self.s.names)
        except ValueError:  # not a certificate
            return True

    def _adopt(self, kept: KeptCertificate) -> KeptCertificate:
        if write_pair(kept.serving, self._cert_file, self._key_file):
            log.info("controller_certificate_written", cert_file=self._cert_file)
        self.kept = kept
        return kept

    async def publish(self) -> None:
        """The CA agents trust, from the kept Secret or from ``tls.ca_file``."""
        if self.publisher is None:
            return
        if self.s.secret:
            ca = self.kept.ca.cert if self.kept is not None else b""
        else:
            ca = await asyncio.to_thread(Path(self.s.ca_file).read_bytes)
        if ca:
            await self.publisher.publish(ca.decode())

    async def start(self) -> None:
        """Before the listener: the pair in place and the CA published."""
        try:
            if self.s.secret:
                await self.ensure()
            await self.publish()
        except GpuHealthError as exc:
            raise ConfigError(f"the controller's certificate: {exc}") from exc
        except OSError as exc:
            raise ConfigError(f"tls.ca_file {self.s.ca_file}: {exc}") from exc

    async def run(self) -> None:
        """The named task ``tls-certificate``: read again, renew, publish, every
        ``tls.check_interval_s``; a failed pass is logged and tried again."""
        while True:
            await self._clock.sleep(self.s.check_interval_s)
            try:
                if self.s.secret:
                    await self.ensure()
                await self.publish()
            except (GpuHealthError, OSError) as exc:
                self.failed_checks += 1
                log.warning("controller_certificate_check_failed", error=str(exc))


class CertificateCollector(Collector):
    """``gpuhealth_tls_certificate_events_total{event}`` (created, renewed, ca_published,
    check_failed) and ``gpuhealth_tls_certificate_not_after_timestamp_seconds`` (the kept
    certificate's end; absent without one)."""

    def __init__(self, keeper: CertificateKeeper | None) -> None:
        self._k = keeper

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        k = self._k
        counts: Counter[str] = Counter()
        if k is not None:
            counts.update(
                created=k.created,
                renewed=k.renewed,
                ca_published=k.publisher.writes if k.publisher is not None else 0,
                check_failed=k.failed_checks,
            )
        events = CounterMetricFamily(
            "gpuhealth_tls_certificate_events",
            "The controller's own certificate and published CA: created, renewed, "
            "ca_published, check_failed (controller/http/certificates.py)",
            labels=["event"],
        )
        for event in ("created", "renewed", "ca_published", "check_failed"):
            events.add_metric([event], float(counts[event]))
        yield events
        end = GaugeMetricFamily(
            "gpuhealth_tls_certificate_not_after_timestamp_seconds",
            "Unix time the serving certificate the controller keeps itself ends (it renews it "
            "tls.renew_before_days before)",
        )
        if k is not None and k.kept is not None:
            end.add_metric([], k.kept.serving.not_after.timestamp())
        yield end
