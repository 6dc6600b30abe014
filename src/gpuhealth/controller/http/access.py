"""Who may call which controller endpoint: the pure table behind the HTTP authorizer.

Like kube-rbac-proxy, a request is mapped to the attributes of a SubjectAccessReview; the
chart's operator and viewer Roles grant exactly these (deploy/helm/gpuhealth, "RBAC"):

- ``POST /api/v1/breaker/reset``: ``update`` ``circuitbreakers.gpuhealth.io`` in the
  controller's namespace (``leader.namespace``); always.
- ``POST /api/v1/shards/reports`` and ``POST /api/v1/shards/attempts`` (past one process, one
  shard's owner handing another the reports and attempts of the jobs it decides:
  :mod:`gpuhealth.controller.incidents.handoff`): ``create`` ``shardreports.gpuhealth.io`` in
  the controller's namespace; always (the chart grants it to the controller's own
  ServiceAccount when ``shards.count`` > 1).
- Any other POST, PUT, PATCH or DELETE: the method's verb on the non-resource URL (``create``
  on ``/path``); always, so a route added later is closed until it is listed here.
- ``GET /metrics``: ``get`` on the non-resource URL ``/metrics``, with ``http.auth.reads:
  authorized`` (the default; what Prometheus' usual ClusterRole grants).
- Every other GET (the fleet API, incidents, the breaker, the status page's overview):
  ``get`` ``fleet.gpuhealth.io`` in the controller's namespace, with ``reads: authorized``.
- Probes, the status page's own files (``/`` and ``/static/…``: HTML, script and style, no
  data; the page sends the token the viewer gives it), ``/v1/stream`` (its own TokenReview)
  and the scheduler extender: always open.

``circuitbreakers``, ``fleet`` and ``shardreports`` are not served resources
(``gpuhealth.io`` serves only GPURemediations): they are names for RBAC only, as with
kube-rbac-proxy's resource attributes. The scheduler extender stays open because
kube-scheduler sends no credentials to extenders and its two POSTs change nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpuhealth.controller.http.api import BREAKER_RESET_PATH
from gpuhealth.controller.incidents.handoff import ATTEMPTS_PATH, REPORTS_PATH
from gpuhealth.controller.names import API_GROUP
from gpuhealth.controller.placement.http import FILTER_PATH, PRIORITIZE_PATH
from gpuhealth.controller.stream.server import STREAM_PATH

BREAKER_RESOURCE = "circuitbreakers"
FLEET_RESOURCE = "fleet"
SHARD_REPORTS_RESOURCE = "shardreports"
HANDOFF_PATHS = frozenset({REPORTS_PATH, ATTEMPTS_PATH})
"""The replicas' own POSTs (past one process): a job's reports and attempts handed to the
owner that decides them."""
METRICS_PATH = "/metrics"

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/readyz/replica", STREAM_PATH})
"""Never checked: probes (the kubelet has no token) and the stream (authenticated itself)."""
PAGE_FILES = frozenset({"/", "/static/app.js", "/static/style.css"})
"""The status page's own files, read without a token: they hold no data (the page asks for a
token and sends it with ``/api/v1/overview``)."""
SCHEDULER_PATHS = frozenset({FILTER_PATH, PRIORITIZE_PATH})
"""kube-scheduler's extender calls: POST, but they only compute an answer."""
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

VERBS = {"GET": "get", "HEAD": "get", "OPTIONS": "get", "POST": "create", "PUT": "update"}
VERBS |= {"PATCH": "patch", "DELETE": "delete"}
"""HTTP method → RBAC verb (kube-rbac-proxy's mapping)."""

Rule = Literal["operator", "read", "metrics", "replica", "other"]
"""Which row of the table a request fell under: the ``rule`` label of the auth metric."""


@dataclass(frozen=True, slots=True)
class ResourceAccess:
    verb: str
    resource: str
    namespace: str
    group: str = API_GROUP

    def attributes(self) -> dict[str, str]:
        """``spec.resourceAttributes`` of a SubjectAccessReview."""
        return {
            "verb": self.verb,
            "group": self.group,
            "resource": self.resource,
            "namespace": self.namespace,
        }

    def describe(self) -> str:
        return f"{self.verb} {self.resource}.{self.group} in namespace {self.namespace!r}"


@dataclass(frozen=True, slots=True)
class PathAccess:
    verb: str
    path: str

    def attributes(self) -> dict[str, str]:
        """``spec.nonResourceAttributes`` of a SubjectAccessReview."""
        return {"verb": self.verb, "path": self.path}

    def describe(self) -> str:
        return f"{self.verb} {self.path}"


Access = ResourceAccess | PathAccess


@dataclass(frozen=True, slots=True)
class AccessRequirement:
    rule: Rule
    access: Access


def required_access(
    method: str, path: str, *, reads_authorized: bool, namespace: str
) -> AccessRequirement | None:
    """What the caller of ``method path`` must be allowed; None: the endpoint is open."""
    method = method.upper()
    if path in OPEN_PATHS or path in SCHEDULER_PATHS:
        return None
    if method in READ_METHODS:
        if not reads_authorized or path in PAGE_FILES:
            return None
        if path == METRICS_PATH:
            return AccessRequirement("metrics", PathAccess("get", METRICS_PATH))
        return AccessRequirement("read", ResourceAccess("get", FLEET_RESOURCE, namespace))
    if method == "POST" and path == BREAKER_RESET_PATH:
        return AccessRequirement("operator", ResourceAccess("update", BREAKER_RESOURCE, namespace))
    if method == "POST" and path in HANDOFF_PATHS:
        return AccessRequirement(
            "replica", ResourceAccess("create", SHARD_REPORTS_RESOURCE, namespace)
        )
    return AccessRequirement("other", PathAccess(VERBS.get(method, method.lower()), path))
