"""Health-aware placement: the kube-scheduler extender (filter and prioritize)."""

from gpuhealth.controller.placement.extender import filter_nodes, pod_request, prioritize
from gpuhealth.controller.placement.http import (
    ClientCertificateCheck,
    ExtenderCollector,
    ExtenderHandlers,
    ExtenderMetrics,
    extender_app,
    extender_routes,
)
from gpuhealth.controller.placement.settings import ExtenderSettings
from gpuhealth.controller.placement.view import NodeSummary, PlacementIndex, summarize

__all__ = [
    "ClientCertificateCheck",
    "ExtenderCollector",
    "ExtenderHandlers",
    "ExtenderMetrics",
    "ExtenderSettings",
    "NodeSummary",
    "PlacementIndex",
    "extender_app",
    "extender_routes",
    "filter_nodes",
    "pod_request",
    "prioritize",
    "summarize",
]
