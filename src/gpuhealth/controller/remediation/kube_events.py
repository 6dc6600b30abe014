"""Events about GPURemediations (``kubectl describe gpuremediation``) and their Nodes.

Both objects are cluster-scoped, so their Events live in ``events_namespace`` (``default``,
where the API server accepts Events about cluster-scoped objects).
"""

from __future__ import annotations

from datetime import datetime

from gpuhealth.controller.kube.events import post_event
from gpuhealth.controller.kube.rest import ApiClient
from gpuhealth.controller.names import CONTROLLER
from gpuhealth.controller.remediation.model import API_VERSION, KIND, Episode
from gpuhealth.controller.remediation.step import Note


class RemediationKubeEvents:
    """Implements the runner's ``KubeEventSink``."""

    def __init__(
        self,
        api: ApiClient,
        *,
        events_namespace: str = "default",
        component: str = CONTROLLER,
        timeout_s: float = 10.0,
    ) -> None:
        self._api = api
        self._ns = events_namespace
        self._component = component
        self._timeout = timeout_s

    async def post(self, ep: Episode, note: Note, now: datetime) -> None:
        targets = [{"apiVersion": API_VERSION, "kind": KIND, "name": ep.name, "uid": ep.uid}]
        if note.node:
            targets.append({"apiVersion": "v1", "kind": "Node", "name": ep.node})
        for involved in targets:
            node_event = involved["kind"] == "Node"
            await post_event(
                self._api,
                namespace=self._ns,
                involved=involved,
                reason=note.reason,
                message=f"{ep.name}: {note.message}" if node_event else note.message,
                event_type=note.type,
                component=self._component,
                now=now,
                timeout_s=self._timeout,
            )
