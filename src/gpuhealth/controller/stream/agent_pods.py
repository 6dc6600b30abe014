"""The agent pods, watched: a bound token is good only while the pod it is bound to lives.

A projected ServiceAccount token names its pod (``authentication.kubernetes.io/pod-name`` and
``pod-uid`` in the TokenReview's extras). The API server refuses the token once that pod is
gone, but a stream authenticated with it, or a cached review of it, would outlive the pod.
This watch (the agent ServiceAccount's pods in the agent namespace, field selector
``spec.serviceAccountName``) tells the stream server at once when a pod is *gone*: deleted,
terminating (``deletionTimestamp`` set), finished (phase Succeeded/Failed), or replaced by a
new pod of the same name. Gone UIDs are remembered (bounded) so that their tokens are refused
without asking the API server again; a UID this replica has not seen yet is looked up with
one GET before it is trusted.

RBAC: ``list``/``watch`` pods in the agent namespace, ``get`` pods.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.common.logging import get_logger
from gpuhealth.controller.kube.informer import EventType, Informer
from gpuhealth.controller.kube.rest import ApiClient, NotFoundError, request
from gpuhealth.controller.kube.settings import WatchSettings

log = get_logger("kube.agent_pods")

GONE_REMEMBERED = 100_000
"""UIDs of gone pods kept to refuse their tokens without a GET (oldest forgotten first)."""

RevokeListener = Callable[[str, str], None]
"""Called with a gone pod's UID and why (deleted, terminating, finished, replaced)."""


@dataclass(frozen=True, slots=True)
class AgentPod:
    uid: str
    name: str
    node: str


def gone_reason(obj: dict[str, Any]) -> str | None:
    """Why this pod's tokens must no longer be honoured, or None while it lives."""
    meta = obj.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return "terminating"
    if (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return "finished"
    return None


def agent_pod(obj: dict[str, Any]) -> AgentPod:
    meta = obj.get("metadata") or {}
    return AgentPod(
        uid=str(meta.get("uid", "")),
        name=str(meta.get("name", "")),
        node=str((obj.get("spec") or {}).get("nodeName") or ""),
    )


class AgentPods:
    def __init__(
        self,
        api: ApiClient,
        namespace: str,
        service_account: str,
        *,
        settings: WatchSettings | None = None,
        timeout_s: float = 10.0,
        clock: Clock | None = None,
    ) -> None:
        self._api = api
        self.namespace = namespace
        self.service_account = service_account
        self._timeout = timeout_s
        self._live: dict[str, AgentPod] = {}
        """Live agent pods by UID."""
        self._by_name: dict[str, str] = {}
        self._gone: OrderedDict[str, str] = OrderedDict()
        self._listeners: list[RevokeListener] = []
        self.revoked = 0
        path = f"/api/v1/namespaces/{quote(namespace)}/pods"
        self.watch = Informer(
            api,
            path,
            self,
            query=[("fieldSelector", f"spec.serviceAccountName={service_account}")],
            settings=settings,
            clock=clock or SystemClock(),
            what="agent pods",
        )

    def subscribe(self, listener: RevokeListener) -> None:
        self._listeners.append(listener)

    async def run(self) -> None:
        await self.watch.run()

    # -- the informer's sink ---------------------------------------------------------------------

    def listed(self, items: list[dict[str, Any]], seen: set[str]) -> None:
        for obj in items:
            self.apply("ADDED", obj)
            seen.add(agent_pod(obj).uid)

    def list_complete(self, seen: set[str]) -> None:
        for uid in [u for u in self._live if u not in seen]:
            self._revoke(uid, "deleted")

    def apply(self, event: EventType, obj: dict[str, Any]) -> None:
        pod = agent_pod(obj)
        if not pod.uid:
            return
        reason = "deleted" if event == "DELETED" else gone_reason(obj)
        if reason is not None:
            self._revoke(pod.uid, reason, pod)
            return
        if pod.uid in self._gone:
            return  # a late event of a pod already gone
        previous = self._by_name.get(pod.name)
        if previous is not None and previous != pod.uid:
            self._revoke(previous, "replaced")
        self._live[pod.uid] = pod
        self._by_name[pod.name] = pod.uid

    def _revoke(self, uid: str, reason: str, pod: AgentPod | None = None) -> None:
        known = self._live.pop(uid, None) or pod
        if known is not None and self._by_name.get(known.name) == uid:
            del self._by_name[known.name]
        if uid in self._gone:
            return
        self._gone[uid] = reason
        while len(self._gone) > GONE_REMEMBERED:
            self._gone.popitem(last=False)
        self.revoked += 1
        log.info(
            "agent_pod_gone",
            uid=uid,
            pod=known.name if known else None,
            node=known.node if known else None,
            reason=reason,
        )
        for listener in self._listeners:
            try:
                listener(uid, reason)
            except Exception:
                log.exception("agent_pod_listener_failed")

    # -- the stream server's question -----------------------------------------------------------

    def bound(self, uid: str) -> tuple[str, str] | None:
        """(name, node) of the pod with this UID while the watch knows it alive, else None."""
        pod = self._live.get(uid)
        return (pod.name, pod.node) if pod is not None else None

    def gone(self, uid: str) -> str | None:
        """Why the pod with this UID is known to be gone, or None."""
        return self._gone.get(uid)

    async def alive(self, uid: str, name: str) -> bool:
        """Is the agent pod ``name`` with ``uid`` alive? From the watch when it knows the
        UID; otherwise one GET (a pod newer than the watch has caught up with). API errors
        propagate (:class:`~gpuhealth.controller.kube.rest.KubeError`): the caller retries later."""
        if uid in self._live:
            return True
        if uid in self._gone:
            return False
        try:
            obj = await request(
                self._api,
                "GET",
                f"/api/v1/namespaces/{quote(self.namespace)}/pods/{quote(name)}",
                timeout_s=self._timeout,
            )
        except NotFoundError:
            self._revoke(uid, "deleted", AgentPod(uid, name, ""))
            return False
        pod = agent_pod(obj)
        spec = obj.get("spec") or {}
        if pod.uid != uid:
            self._revoke(uid, "replaced", AgentPod(uid, name, ""))
            return False
        if spec.get("serviceAccountName") != self.service_account:
            return False
        self.apply("MODIFIED", obj)
        return uid in self._live
