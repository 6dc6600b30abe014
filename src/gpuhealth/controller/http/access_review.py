"""SubjectAccessReview: may this reviewed caller do that? (the HTTP authorizer's API side).

Needs RBAC ``create`` on ``subjectaccessreviews`` (``system:auth-delegator`` grants it, with
``tokenreviews``); the chart's controller ClusterRole grants exactly those two.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuhealth.controller.http.access import Access, ResourceAccess
from gpuhealth.controller.kube.rest import ApiClient, KubeError, request
from gpuhealth.controller.stream.auth import AuthUnavailable, Identity

SAR_PATH = "/apis/authorization.k8s.io/v1/subjectaccessreviews"


@dataclass(frozen=True, slots=True)
class AccessVerdict:
    allowed: bool
    reason: str = ""
    """The authorizer's reason (RBAC names the binding that allowed, or says nothing)."""


def review_body(identity: Identity, access: Access) -> dict[str, object]:
    """The SubjectAccessReview for ``identity`` (from a TokenReview) asking ``access``."""
    spec: dict[str, object] = {
        "user": identity.username,
        "groups": list(identity.groups),
        "extra": {k: list(v) for k, v in identity.extra.items()},
    }
    if identity.uid:
        spec["uid"] = identity.uid
    key = "resourceAttributes" if isinstance(access, ResourceAccess) else "nonResourceAttributes"
    spec[key] = access.attributes()
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}


class SubjectAccessReviewer:
    def __init__(self, api: ApiClient, *, timeout_s: float = 5.0) -> None:
        self._api = api
        self._timeout_s = timeout_s

    async def review(self, identity: Identity, access: Access) -> AccessVerdict:
        """Raises :class:`AuthUnavailable` when the API server cannot be asked."""
        try:
            doc = await request(
                self._api,
                "POST",
                SAR_PATH,
                body=review_body(identity, access),
                timeout_s=self._timeout_s,
            )
        except (KubeError, TimeoutError, OSError) as exc:
            raise AuthUnavailable(f"SubjectAccessReview failed: {exc}") from exc
        status = doc.get("status") or {}
        return AccessVerdict(
            allowed=bool(status.get("allowed")) and not status.get("denied"),
            reason=str(status.get("reason") or status.get("evaluationError") or ""),
        )
