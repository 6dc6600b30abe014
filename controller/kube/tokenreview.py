"""TokenReview: the real :class:`~controller.stream.auth.Authenticator` (API server side)."""

from __future__ import annotations

from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from gpuhealth.controller.stream.auth import AuthUnavailable, Identity


class TokenReviewAuthenticator:
    """Reviews a bearer token with ``authentication.k8s.io/v1`` TokenReview for one audience
    (a ``str``), for a few (a tuple), or for the API server's own (an empty tuple).

    Needs RBAC ``create`` on ``tokenreviews`` (the ``system:auth-delegator`` ClusterRole).
    """

    def __init__(
        self, api: client.ApiClient, audience: str | tuple[str, ...], *, timeout_s: float = 5.0
    ) -> None:
        self._api = client.AuthenticationV1Api(api)
        self._audiences = [audience] if isinstance(audience, str) else list(audience)
        self._timeout_s = timeout_s
        """Deadline of one review call."""

    async def review(self, token: str) -> Identity:
        body = client.V1TokenReview(
            spec=client.V1TokenReviewSpec(token=token, audiences=self._audiences or None)
        )
        try:
            result: Any = await self._api.create_token_review(
                body, _request_timeout=self._timeout_s
            )
        except ApiException as exc:
            raise AuthUnavailable(f"TokenReview failed: HTTP {exc.status} {exc.reason}") from exc
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise AuthUnavailable(f"TokenReview failed: {exc}") from exc
        status = result.status
        if status is None:
            return Identity(authenticated=False, error="empty TokenReview status")
        user = status.user
        extra: dict[str, list[str]] = (user.extra if user is not None else None) or {}
        return Identity(
            authenticated=bool(status.authenticated),
            username=(user.username if user is not None else None) or "",
            uid=(user.uid if user is not None else None) or "",
            groups=tuple((user.groups if user is not None else None) or ()),
            audiences=tuple(status.audiences or ()),
            extra={k: tuple(v or ()) for k, v in extra.items()},
            error=status.error or "",
        )
