"""Named, documented settings of the controller's HTTP server (the ``http:`` section): how long
a client may take to send a request, how many half-open requests one client may hold, and who
must authenticate (``http.auth``); and the ``tls:`` section: the certificate the controller
keeps itself and the CA it publishes for agents (``controller/http/certificates.py``). See
docs/operations.md "Who may call the controller"."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from gpuhealth.common.config import PositiveInt, PositiveSeconds, SettingError, Settings

RequestSeconds = Annotated[float, Meta(gt=0.0, le=600.0)]
"""A per-request deadline: positive, at most 10 minutes."""


class HttpAuthSettings(Settings, frozen=True, kw_only=True):
    reads: Literal["open", "authorized"] = "authorized"
    """``authorized``: the read-only endpoints (``GET /api/v1/fleet``, ``/api/v1/incidents``,
    ``/api/v1/breaker``, the status page's ``/api/v1/overview``, ``/metrics``) need a bearer
    token (TokenReview) that may ``get`` them (SubjectAccessReview: ``get fleet.gpuhealth.io``
    in the controller's namespace, ``get`` on the non-resource URL ``/metrics``), like the
    state-changing endpoints, which always do: they list every pod's GPU allocation and name
    jobs. ``open``: they answer anyone who reaches the port (a trusted network, tests).
    Probes, the status page's own files (``/``, ``/static/``: no data; the page asks for a
    token), the agents' stream (its own authentication) and the scheduler extender stay
    open."""
    audiences: tuple[str, ...] = ()
    """Audiences a caller's token is reviewed for; empty = the API server's own (the token
    of a kubeconfig user or a ServiceAccount)."""
    cache_ttl_s: Annotated[float, Meta(ge=0.0, le=10.0)] = 5.0
    """How long a positive TokenReview and an allowing SubjectAccessReview are reused (0: not
    at all); at most the API server's own token cache (10 s). Refusals are never cached."""
    cache_max_entries: PositiveInt = 1024
    """Bound on each of the two caches; the oldest entry is evicted first."""
    max_concurrent_reviews: Annotated[int, Meta(ge=1, le=256)] = 8
    """TokenReviews and SubjectAccessReviews in flight at once; more callers wait."""
    failed_reviews_per_s: Annotated[float, Meta(gt=0.0, le=1000.0)] = 1.0
    """Tokens that did not validate are forgiven at this rate per client address: a client
    that sent ``failed_reviews_burst`` of them gets 429 (no TokenReview asked) until one is
    forgiven. Refusals are never cached, so without it every forged token costs the API
    server a review. Valid tokens spend nothing."""
    failed_reviews_burst: Annotated[int, Meta(ge=1, le=100_000)] = 10
    """Tokens that did not validate that one client address may send in a row."""


class HttpSettings(Settings, frozen=True, kw_only=True):
    header_timeout_s: RequestSeconds = 10.0
    """A request's line and headers must be complete within this time of the connection
    being opened, or of the request's first byte on a kept-alive connection; else the
    connection is closed (slowloris). With TLS the handshake has the same bound."""
    body_timeout_s: RequestSeconds = 10.0
    """A request body must have arrived within this time of its headers; else 408 and close."""
    idle_timeout_s: RequestSeconds = 60.0
    """A kept-alive connection with no new request for this long is closed."""
    max_body_bytes: Annotated[int, Meta(ge=1024, le=1 << 30)] = 64 << 10
    """Largest request body a route accepts, read (within ``body_timeout_s``) before
    authentication; larger gets 413 and the connection is closed. The scheduler extender's
    routes have their own, larger limit (``extender.max_body_bytes``)."""
    max_concurrent_body_reads: Annotated[int, Meta(ge=1, le=1024)] = 8
    """Request bodies read at once. Bodies are read before authentication (the extender's up
    to ``extender.max_body_bytes``), so this bounds the memory any caller who reaches the
    port can make the controller hold to about this many times the largest body limit. One
    more is answered 503 with ``Retry-After`` without its body read and the connection closed
    (``gpuhealth_http_connections_closed_total{reason="too_many_body_reads"}``).
    kube-scheduler calls the extender one pod at a time."""
    max_pending_per_client: Annotated[int, Meta(ge=1, le=100_000)] = 32
    """Connections one client address may hold whose first request's headers are not complete
    yet; one more is closed at once. Agents, the scheduler and operators each need one or two."""
    listen_backlog: Annotated[int, Meta(ge=16, le=65_535)] = 4096
    """Connections the kernel queues for the controller before it accepts them (``listen``'s
    backlog; capped by the node's ``net.core.somaxconn``). When every agent reconnects at once
    (a failover, 20,000 nodes), aiohttp's default of 128 overflows: the rest wait for SYN
    retransmits (1, 3, 7 s ...) and time out, then back off (bench ``fleet_scale``)."""
    accept_batch: Annotated[int, Meta(ge=1, le=65_535)] = 64
    """Connections accepted in one turn of the event loop; the rest wait in the kernel's queue
    (``listen_backlog``) for the next turn. Accepting a whole storm in one turn (what the event
    loops do by themselves) made single turns take seconds at 19,000 agents at once: the Lease
    renewal waited behind them and leadership was lost (bench ``fleet_scale``). Small enough
    that a turn stays short, large enough that accepting keeps up (thousands a second)."""
    max_unready: Annotated[int, Meta(ge=1, le=65_535)] = 256
    """Accepted connections whose first request's headers are not complete yet (a TLS
    handshake included); at this many the controller accepts no more until one completes or
    closes, and new ones wait in the kernel's queue (``listen_backlog``), where no deadline
    runs. Without it, in a storm of 19,000 agents at once, connections accepted faster than
    the loop reached their headers missed ``header_timeout_s`` by the thousand, and their
    agents had to come back (bench ``fleet_scale``)."""
    accept_retry_s: Annotated[float, Meta(gt=0.0, le=60.0)] = 1.0
    """How long accepting pauses after the process ran out of file descriptors or kernel
    memory for a new connection (``EMFILE``, ``ENFILE``, ``ENOBUFS``, ``ENOMEM``); the
    connections wait in the kernel's queue meanwhile."""
    tcp_keepalive_idle_s: Annotated[int, Meta(ge=1, le=32_767)] = 60
    """Seconds without a byte either way before the kernel probes a connection (TCP
    keepalive on every accepted connection). Reaps half-open connections, an agent's node gone
    without closing its socket, at no cost to the controller's event loop; agents send a
    Heartbeat every 10 s, so their live streams are never probed."""
    tcp_keepalive_interval_s: Annotated[int, Meta(ge=1, le=32_767)] = 10
    """Seconds between unanswered keepalive probes."""
    tcp_keepalive_probes: Annotated[int, Meta(ge=1, le=127)] = 3
    """Unanswered probes after which the kernel closes the connection: a half-open
    connection is gone about ``idle + interval x probes`` (90 s) after its peer's last byte."""
    auth: HttpAuthSettings = msgspec.field(default_factory=HttpAuthSettings)
    """Who must authenticate (``http.auth``)."""

    def check(self) -> None:
        if self.idle_timeout_s < self.header_timeout_s:
            raise SettingError("idle_timeout_s", "must not be below header_timeout_s")


class TlsSettings(Settings, frozen=True, kw_only=True):
    """The ``tls:`` section: a certificate the controller keeps itself, and the CA agents
    trust, published (``controller/http/certificates.py``). The listener always serves
    ``tls_cert_file`` / ``tls_key_file``; with ``secret`` the controller writes them."""

    secret: str = ""
    """A Secret (in ``leader.namespace``) where the controller keeps its own CA and serving
    certificate: created once when absent (a new CA), never regenerated by a deploy (the
    chart's ``controller.tls.generatedBy: controller``: it survives ``helm template``, Argo CD
    and Flux), renewed by the controller before it ends; the pair is written to
    ``tls_cert_file`` / ``tls_key_file``. Empty: those files come from elsewhere (the chart's
    generated Secret, cert-manager's, yours)."""
    ca_configmap: str = ""
    """A ConfigMap (in ``leader.namespace``) the controller keeps the CA agents trust in (key
    ``ca.crt``, nothing else): the CA of ``secret``, or of ``ca_file``. Empty: none."""
    ca_file: str = ""
    """Without ``secret``: the CA file published in ``ca_configmap`` (``ca.crt`` of a
    certificate mounted from cert-manager's Secret or yours)."""
    names: tuple[str, ...] = ()
    """DNS names of the serving certificate the controller issues itself (the first is its
    subject): the Service's names, and ``localhost`` for a port-forward."""
    ca_validity_days: Annotated[int, Meta(ge=1, le=36500)] = 3650
    """Validity of the CA the controller creates (a new CA means restarting the agents:
    chart README "TLS")."""
    validity_days: Annotated[int, Meta(ge=1, le=3650)] = 365
    """Validity of the serving certificate it issues itself."""
    renew_before_days: Annotated[int, Meta(ge=1, le=3650)] = 30
    """The serving certificate is renewed (the same CA) this long before it ends."""
    check_interval_s: PositiveSeconds = 60.0
    """How often the kept Secret is read again (another replica's renewal, an operator's
    deletion to rotate) and the CA published again."""

    def check(self) -> None:
        if self.secret and not self.names:
            raise SettingError("names", "a certificate the controller issues needs its names")
        if self.secret and self.ca_file:
            raise SettingError("ca_file", "only without secret (the kept Secret holds the CA)")
        if self.ca_file and not self.ca_configmap:
            raise SettingError("ca_file", "is published in ca_configmap: set it too")
        if self.renew_before_days >= self.validity_days:
            raise SettingError("renew_before_days", "must be shorter than validity_days")
