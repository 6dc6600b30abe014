"""Settings of leader election (the ``leader:`` section)."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from gpuhealth.common.config import (
    PositiveSeconds,
    SettingError,
    Settings,
)


class LeaderSettings(Settings, frozen=True, kw_only=True):
    enabled: bool = True
    """Off: no Lease; this replica always acts as the leader (a single replica only)."""
    namespace: str = "gpuhealth"
    """Namespace of the Lease, the breaker ConfigMap and the operators' access checks (the
    release namespace)."""
    lease_name: str = "gpuhealth-controller"
    """Name of the coordination.k8s.io Lease the replicas compete for."""
    identity: str = ""
    """Empty = ``$POD_NAME`` or ``hostname-pid``."""
    lease_duration_s: Annotated[int, Meta(ge=2, le=3600)] = 15
    """Whole seconds (the Lease stores an integer): how long a dead leader blocks takeover."""
    renew_deadline_s: PositiveSeconds = 10.0
    """How long the leader keeps retrying a failed renewal before it stops acting."""
    retry_period_s: Annotated[float, Meta(ge=1.0, le=3600.0)] = 2.0
    """Time between attempts to acquire or renew the Lease."""
    request_timeout_s: PositiveSeconds = 5.0
    """Deadline of one Lease read or write (a renewal also stops at ``renew_deadline_s``)."""
    service: str = ""
    """The controller's Service (without a selector) whose endpoint the leader publishes: an
    EndpointSlice ``<service>-leader`` pointing at this pod's ``$POD_IP``, so agents and
    kube-scheduler reach the leader (controller/leadership/endpoint.py). Empty: none."""
    endpoint_interval_s: PositiveSeconds = 10.0
    """How often the leader re-asserts that endpoint (repairs an edit or a lost write)."""

    def check(self) -> None:
        if not self.lease_duration_s > self.renew_deadline_s:
            raise SettingError("renew_deadline_s", "must be shorter than lease_duration_s")
        if not self.renew_deadline_s > 1.2 * self.retry_period_s:
            raise SettingError("retry_period_s", "must be under renew_deadline_s / 1.2")
