"""aiohttp handlers: ``POST /scheduler/filter`` and ``POST /scheduler/prioritize``; past one
process (:class:`ShardedPlacement`) also ``GET /scheduler/scores`` (this replica's scores, an
authorized read like ``/api/v1/fleet``, for the other replicas).

kube-scheduler treats a non-200 answer as an error, so a request we cannot read is answered
200 with ``Error`` set (filter) or 400 (prioritize, whose failures the scheduler ignores); an
unexpected failure is 200 with ``Error`` (filter) or 500. Each request is counted by verb and
result (``ok``, ``bad_request``, ``error``, ``unauthenticated``) and each failure logged as a
warning: the shipped scheduler configuration marks the extender ``ignorable``, so
kube-scheduler itself only logs at info level and schedules without it (alert
``GPUHealthExtenderErrors``). The time of the last answered call is exported too
(``gpuhealth_extender_last_call_timestamp_seconds``).

With ``extender.client_ca_file`` a caller must present a client certificate that CA signed
(:class:`ClientCertificateCheck`, run by the HTTP limits before the body is read: an
unauthenticated caller makes the controller read nothing); without it 401.
"""

from __future__ import annotations

import bisect
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import msgspec
from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from gpuhealth.common.logging import get_logger
from gpuhealth.controller.placement.extender import (
    ExtenderArgs,
    ExtenderError,
    ExtenderFilterResult,
    filter_nodes,
    filter_result,
    judge_unheld,
    node_names,
    pod_request,
    prioritize_json,
)
from gpuhealth.controller.placement.peer_scores import SCORES_PATH, PeerScores, scores_json
from gpuhealth.controller.placement.settings import ExtenderSettings
from gpuhealth.controller.placement.view import NodeSummary

log = get_logger("extender")

FILTER_PATH = "/scheduler/filter"
PRIORITIZE_PATH = "/scheduler/prioritize"
BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)

_args_decoder = msgspec.json.Decoder(ExtenderArgs)
_encoder = msgspec.json.Encoder()


@dataclass
class ExtenderMetrics:
    requests: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(verb, result) -> count; result is ok, bad_request (undecodable, too large), error or
    unauthenticated (no client certificate, with ``extender.client_ca_file``)."""
    buckets: dict[str, list[int]] = field(default_factory=dict)
    sums: dict[str, float] = field(default_factory=dict)
    last_call: float = field(default_factory=time.time)
    """Unix time of the last call answered (the process's start before the first): the alert
    ``GPUHealthExtenderSilent`` compares it with GPU pods being placed."""

    def observe(self, verb: str, result: str, seconds: float) -> None:
        self.requests[verb, result] += 1
        if result != "unauthenticated":
            self.last_call = time.time()
        counts = self.buckets.setdefault(verb, [0] * (len(BUCKETS_S) + 1))
        counts[bisect.bisect_left(BUCKETS_S, seconds)] += 1
        self.sums[verb] = self.sums.get(verb, 0.0) + seconds


class ExtenderCollector(Collector):
    def __init__(self, metrics: ExtenderMetrics) -> None:
        self._m = metrics

    def collect(self) -> Iterator[CounterMetricFamily | HistogramMetricFamily | GaugeMetricFamily]:
        c = CounterMetricFamily(
            "gpuhealth_extender_requests", "Scheduler-extender calls", labels=["verb", "result"]
        )
        for (verb, result), n in sorted(self._m.requests.items()):
            c.add_metric([verb, result], float(n))
        yield c
        yield GaugeMetricFamily(
            "gpuhealth_extender_last_call_timestamp_seconds",
            "Unix time of the last scheduler-extender call answered (the process start "
            "before the first)",
            value=self._m.last_call,
        )
        h = HistogramMetricFamily(
            "gpuhealth_extender_duration_seconds", "Scheduler-extender latency", labels=["verb"]
        )
        for verb, counts in sorted(self._m.buckets.items()):
            cumulative, acc = [], 0
            for bound, n in zip([*map(str, BUCKETS_S), "+Inf"], counts, strict=True):
                acc += n
                cumulative.append((bound, float(acc)))
            h.add_metric([verb], cumulative, self._m.sums[verb])
        yield h


SummaryLookup = Callable[[], dict[str, NodeSummary]]


class ExtenderHandlers:
    """Serves filter and prioritize from a summaries lookup (e.g. ``PlacementIndex.summaries``)."""

    def __init__(
        self,
        summaries: SummaryLookup,
        settings: ExtenderSettings | None = None,
        metrics: ExtenderMetrics | None = None,
        shards: ShardedPlacement | None = None,
    ) -> None:
        """``shards``: past one process (None: one process holds the fleet, as before)."""
        self._summaries = summaries
        self.settings = settings or ExtenderSettings()
        self.metrics = metrics or ExtenderMetrics()
        self.shards = shards

    async def _args(self, request: web.Request) -> ExtenderArgs:
        # Behind the controller's middleware the body has been read already (within the
        # route's limit, extender.max_body_bytes, and http.body_timeout_s) and read() returns
        # it; a stand-alone app (extender_app) reads it here within its client_max_size.
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge as exc:
            raise ExtenderError(
                f"request body larger than {request.client_max_size} bytes"
            ) from exc
        try:
            return _args_decoder.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ExtenderError(f"invalid ExtenderArgs: {exc}") from exc

    def _refused(self, verb: str, request: web.Request, exc: Exception) -> str:
        """Log a request the extender could not answer; its result label."""
        if isinstance(exc, ExtenderError):
            log.warning(
                "extender_bad_request",
                verb=verb,
                error=str(exc),
                peer=request.remote,
                body_bytes=request.content_length,
            )
            return "bad_request"
        log.exception("extender_failed", verb=verb, peer=request.remote)
        return "error"

    async def filter(self, request: web.Request) -> web.Response:
        t0 = time.perf_counter()
        try:
            args = await self._args(request)
            need = 0 if args.pod is None else pod_request(args.pod, self.settings.resource)
            names = node_names(args)
            summaries = self._summaries()
            outcome = filter_nodes(names, need, summaries)
            if self.shards is not None:
                outcome = judge_unheld(args, outcome, summaries, self.shards.owns)
            result = filter_result(args, names, outcome)
            status = "ok"
        except Exception as exc:  # every failure is answered in-band and counted
            status = self._refused("filter", request, exc)
            result = ExtenderFilterResult(error=f"gpuhealth: {exc}")
        body = _encoder.encode(result)
        self.metrics.observe("filter", status, time.perf_counter() - t0)
        return web.Response(body=body, content_type="application/json")

    async def prioritize(self, request: web.Request) -> web.Response:
        t0 = time.perf_counter()
        try:
            args = await self._args(request)
            names = node_names(args)
            others = self.shards.peers.scores() if self.shards is not None else None
            body = prioritize_json(
                names, self._summaries(), self.settings.unknown_node_score, others
            )
        except Exception as exc:  # every failure is answered with a status and counted
            status = self._refused("prioritize", request, exc)
            self.metrics.observe("prioritize", status, time.perf_counter() - t0)
            code = 400 if status == "bad_request" else 500
            return web.Response(status=code, text=f"gpuhealth: {exc}")
        self.metrics.observe("prioritize", "ok", time.perf_counter() - t0)
        return web.Response(body=body, content_type="application/json")

    async def scores(self, _request: web.Request) -> web.Response:
        """``GET /scheduler/scores``: this replica's node scores and its shards (what the
        other replicas' :class:`PeerScores` ask past one process)."""
        owned = self.shards.owned() if self.shards is not None else frozenset()
        summaries = self._summaries()
        body = scores_json({n: s.score for n, s in list(summaries.items())}, owned)
        resp = web.json_response(body, headers={"Cache-Control": "no-store"})
        resp.enable_compression()
        return resp


@dataclass(frozen=True, slots=True)
class ShardedPlacement:
    """What the extender needs past one process."""

    owned: Callable[[], frozenset[int]]
    """The shards this replica holds (``ShardLeases.owned``)."""
    owns: Callable[[str], bool]
    """A taint key is gpuhealth's (``Keys.owns``)."""
    peers: PeerScores
    """The other shards' scores."""


class ClientCertificateCheck:
    """The extender's caller must present a client certificate that ``extender.client_ca_file``
    signed (the TLS handshake verified it; a certificate that did not verify never got this
    far): run before the body is read (``ConnectionLimits.body_checks``). None: it did."""

    VERBS = {FILTER_PATH: "filter", PRIORITIZE_PATH: "prioritize"}

    def __init__(self, metrics: ExtenderMetrics) -> None:
        self._metrics = metrics

    def __call__(self, request: web.Request) -> web.Response | None:
        ssl_object = request.transport.get_extra_info("ssl_object") if request.transport else None
        if ssl_object is not None and ssl_object.getpeercert():
            return None
        verb = self.VERBS.get(request.path, "other")
        self._metrics.observe(verb, "unauthenticated", 0.0)
        log.warning("extender_unauthenticated", verb=verb, peer=request.remote)
        return web.json_response(
            {
                "error": "client_certificate_required",
                "message": "the scheduler extender answers only callers with a client "
                "certificate signed by extender.client_ca_file",
            },
            status=401,
        )


def extender_routes(handlers: ExtenderHandlers) -> list[web.RouteDef]:
    """kube-scheduler's routes to mount on the controller's application."""
    return [
        web.post(FILTER_PATH, handlers.filter),
        web.post(PRIORITIZE_PATH, handlers.prioritize),
    ]


def scores_routes(handlers: ExtenderHandlers) -> list[web.RouteDef]:
    """Past one process, the other replicas' route: ``GET /scheduler/scores`` (an authorized
    read, not kube-scheduler's: no client certificate asked); none in one process."""
    return [web.get(SCORES_PATH, handlers.scores)] if handlers.shards is not None else []


def extender_app(handlers: ExtenderHandlers) -> web.Application:
    """A stand-alone application (tests, benchmarks): no middleware, the extender's body
    limit as aiohttp's."""
    app = web.Application(client_max_size=handlers.settings.max_body_bytes)
    app.add_routes([*extender_routes(handlers), *scores_routes(handlers)])
    return app
