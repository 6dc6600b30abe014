"""TokenReview: the real :class:`~gpuhealth.controller.stream.auth.Authenticator` (API server side).

A raw JSON request (:mod:`gpuhealth.controller.kube.rest`) whose answer is decoded straight into the
few fields read: after a failover every agent's token is reviewed at once, and kubernetes_asyncio's
generated models (dateutil parsing every timestamp) were a tenth of the controller's CPU while
19,000 agents connected (py-spy, bench ``fleet_scale``).
"""

from __future__ import annotations

import msgspec

from gpuhealth.controller.kube.rest import ApiClient, KubeError, request
from gpuhealth.controller.stream.auth import AuthUnavailable, Identity

PATH = "/apis/authentication.k8s.io/v1/tokenreviews"


class _User(msgspec.Struct, frozen=True):
    username: str = ""
    uid: str = ""
    groups: list[str] | None = None
    extra: dict[str, list[str] | None] | None = None


class _Status(msgspec.Struct, frozen=True):
    authenticated: bool | None = None
    user: _User | None = None
    audiences: list[str] | None = None
    error: str = ""


class _Review(msgspec.Struct, frozen=True):
    status: _Status | None = None


class TokenReviewAuthenticator:
    """Reviews a bearer token with ``authentication.k8s.io/v1`` TokenReview for one audience
    (a ``str``), for a few (a tuple), or for the API server's own (an empty tuple).

    Needs RBAC ``create`` on ``tokenreviews`` (the ``system:auth-delegator`` ClusterRole).
    """

    def __init__(
        self, api: ApiClient, audience: str | tuple[str, ...], *, timeout_s: float = 5.0
    ) -> None:
        self._api = api
        self._audiences = [audience] if isinstance(audience, str) else list(audience)
        self._timeout_s = timeout_s
        """Deadline of one review call."""

    async def review(self, token: str) -> Identity:
        spec: dict[str, object] = {"token": token}
        if self._audiences:
            spec["audiences"] = self._audiences
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
        try:
            answer = await request(self._api, "POST", PATH, body=body, timeout_s=self._timeout_s)
        except KubeError as exc:
            raise AuthUnavailable(f"TokenReview failed: {exc}") from exc
        try:
            status = msgspec.convert(answer, _Review).status
        except msgspec.ValidationError as exc:
            raise AuthUnavailable(f"TokenReview answer not understood: {exc}") from exc
        if status is None:
            return Identity(authenticated=False, error="empty TokenReview status")
        user = status.user or _User()
        return Identity(
            authenticated=bool(status.authenticated),
            username=user.username,
            uid=user.uid,
            groups=tuple(user.groups or ()),
            audiences=tuple(status.audiences or ()),
            extra={k: tuple(v or ()) for k, v in (user.extra or {}).items()},
            error=status.error,
        )
