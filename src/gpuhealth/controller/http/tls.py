"""The controller's TLS: the server context from ``tls_cert_file``/``tls_key_file``, the rule
that the remediation loop's orders never go out on a plaintext listener, and the reload of a
renewed certificate (cert-manager, a rotated Secret) without a restart.

With ``extender.client_ca_file`` the listener asks every client for a certificate and verifies
one presented against that CA only (never the system's CAs): kube-scheduler presents one, the
extender's routes accept no caller without it (``placement/http.py``); agents and people, who
present none, are served as before.

A Secret volume is updated by swapping a symbolic link, so a renewed pair shows as a change
of the files' identity (inode, size, mtime); the pair is then loaded into a new
``SSLContext``, and the listener's context hands each new handshake to it (its SNI callback
sets the connection's context): new connections get the new certificate, open ones keep
theirs. A pair that does not load (half written, key and certificate not matching) is logged
and the old one kept; the next check tries again.
"""

from __future__ import annotations

import asyncio
import os
import ssl

from gpuhealth.common import logging as glog
from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.common.errors import ConfigError

log = glog.get_logger("controller.tls")

FileIdentity = tuple[tuple[int, int, int], ...]


def _context(cert_file: str, key_file: str, client_ca_file: str | None = None) -> ssl.SSLContext:
    if client_ca_file:
        # not create_default_context: it would trust the system's CAs for client certificates
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_verify_locations(cafile=client_ca_file)
        ctx.verify_mode = ssl.CERT_OPTIONAL
    else:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_file, key_file)
    return ctx


def server_ssl_context(
    cert_file: str | None, key_file: str | None, client_ca_file: str | None = None
) -> ssl.SSLContext | None:
    """HTTPS when both a certificate and a key are configured (``tls_cert_file``,
    ``tls_key_file``); one without the other is an error, and so is a client CA
    (``extender.client_ca_file``) without them."""
    if not cert_file and not key_file:
        if client_ca_file:
            raise ConfigError(
                "extender.client_ca_file: client certificates need TLS "
                "(--tls-cert-file, --tls-key-file)"
            )
        return None
    if not (cert_file and key_file):
        raise ConfigError("--tls-cert-file and --tls-key-file must be given together")
    try:
        return _context(cert_file, key_file, client_ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load TLS certificate/key/client CA: {exc}") from exc


def check_orders_are_encrypted(
    orders: bool, ssl_ctx: ssl.SSLContext | None, *, allow_plaintext: bool
) -> None:
    """The remediation loop's orders (GPU reset, reboot; ``orders``: ``remediation.enabled``)
    go out on the agents' stream: a controller that would send them on a plaintext listener
    refuses to start, unless ``allow_plaintext`` (``allow_plaintext_orders``) says so (tests
    and demos)."""
    if orders and ssl_ctx is None and not allow_plaintext:
        raise ConfigError(
            "remediation.enabled: the remediation loop sends GPU reset and reboot orders on "
            "the agents' stream, which must not be plaintext: serve TLS (--tls-cert-file, "
            "--tls-key-file) or, for tests only, set allow_plaintext_orders"
        )


def _identity(paths: tuple[str, ...]) -> FileIdentity | None:
    try:
        stats = [os.stat(p) for p in paths]
    except OSError:
        return None
    return tuple((st.st_ino, st.st_size, st.st_mtime_ns) for st in stats)


class CertificateReloader:
    """Serves the pair the files hold now: ``listener`` (the context the server was started
    with) passes each handshake to the context last loaded from the files."""

    def __init__(
        self,
        listener: ssl.SSLContext,
        cert_file: str,
        key_file: str,
        clock: Clock | None = None,
        client_ca_file: str | None = None,
    ) -> None:
        self._paths = (cert_file, key_file)
        self._client_ca = client_ca_file
        self._clock = clock or SystemClock()
        self._seen = _identity(self._paths)
        self.current = listener
        self.reloads = 0
        listener.sni_callback = self._select

    def _select(
        self, conn: ssl.SSLObject | ssl.SSLSocket, _name: str | None, ctx: ssl.SSLContext
    ) -> None:
        if self.current is not ctx:
            conn.context = self.current

    def check(self) -> bool:
        """Load the pair again when the files changed since the last load; True when it did."""
        now = _identity(self._paths)
        if now is None or now == self._seen:
            return False
        try:
            fresh = _context(*self._paths, self._client_ca)
        except (OSError, ssl.SSLError) as exc:
            log.warning("tls_reload_failed", cert_file=self._paths[0], error=str(exc))
            return False
        self._seen = now
        self.current = fresh
        self.reloads += 1
        log.info("tls_certificate_reloaded", cert_file=self._paths[0])
        return True

    async def run(self, interval_s: float) -> None:
        while True:
            await self._clock.sleep(interval_s)
            await asyncio.to_thread(self.check)
