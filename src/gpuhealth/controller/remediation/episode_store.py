"""GPURemediation objects: a watch-fed cache for reads, guarded writes to the API server.

Implements the runner's ``EpisodeStore``. The cache is the controller's one cache of its own
objects (:class:`~gpuhealth.controller.kube.object_cache.ObjectCache` over the one LIST+WATCH,
:class:`~gpuhealth.controller.kube.informer.Informer`: 410 Gone relists, other failures back
off and resume; without the CRD, before it was ever listed, the collection is empty and listed
again later; a 404 once it was listed keeps every episode cached, so no quarantine is released
on a "not found").
Status is written with PUT on the status subresource carrying ``metadata.resourceVersion``:
a concurrent writer makes it fail with 409 (:class:`ConflictError`) and the runner re-runs
the pass from the newer object. An object that is not a valid GPURemediation (written by
hand past the schema, or by another version) is skipped, logged and counted
(``gpuhealth_remediation_invalid_objects_total``), never acted on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from urllib.parse import quote

from gpuhealth.common.clock import Clock
from gpuhealth.controller.kube.object_cache import CachedResource, ObjectCache
from gpuhealth.controller.kube.rest import ApiClient, KubeError, request
from gpuhealth.controller.kube.settings import WatchSettings
from gpuhealth.controller.remediation.model import (
    GROUP,
    PLURAL,
    VERSION,
    Episode,
    InvalidEpisode,
    Spec,
    Status,
    episode_body,
    episode_from_api,
    status_body,
)

PATH = f"/apis/{GROUP}/{VERSION}/{PLURAL}"
Listener = Callable[[str], None]


class GPURemediationStore(CachedResource[Episode]):
    def __init__(
        self,
        api: ApiClient,
        settings: WatchSettings | None = None,
        *,
        timeout_s: float = 10.0,
        clock: Clock | None = None,
    ) -> None:
        self._api = api
        self._timeout = timeout_s
        self.cache: ObjectCache[Episode] = ObjectCache(
            api, PATH, episode_from_api, what=PLURAL, settings=settings, clock=clock
        )

    # -- reads (the cache) ------------------------------------------------------------------

    def episodes(self) -> list[Episode]:
        return self.cache.items()

    def get(self, name: str) -> Episode | None:
        return self.cache.get(name)

    def subscribe(self, listener: Listener) -> None:
        """``listener(name)`` after every change of an episode (added, modified, deleted)."""
        self.cache.subscribe(listener)

    # -- writes -----------------------------------------------------------------------------

    async def fetch(self, name: str) -> Episode | None:
        """A fresh GET (bypassing the cache), recorded in the cache."""
        try:
            obj = await request(self._api, "GET", f"{PATH}/{quote(name)}", timeout_s=self._timeout)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        ep = self.cache.parse(obj)
        if ep is not None:
            self.cache.record(ep)
        return ep

    async def create(self, name: str, spec: Spec, labels: Mapping[str, str]) -> Episode | None:
        """Create the episode; None when one of that name exists (the same fault)."""
        body = episode_body(name, spec, labels)
        try:
            obj = await request(self._api, "POST", PATH, body=body, timeout_s=self._timeout)
        except KubeError as exc:
            if exc.status == 409:
                await self.fetch(name)
                return None
            raise
        ep = self.cache.parse(obj)
        if ep is not None:
            self.cache.record(ep)
        return ep

    async def write_status(self, ep: Episode, status: Status) -> Episode:
        obj = await request(
            self._api,
            "PUT",
            f"{PATH}/{quote(ep.name)}/status",
            body=status_body(ep, status),
            timeout_s=self._timeout,
        )
        new = self.cache.parse(obj)
        if new is None:
            raise InvalidEpisode(f"GPURemediation {ep.name}: the API server returned junk")
        self.cache.record(new)
        return new

    async def delete(self, name: str) -> None:
        try:
            await request(self._api, "DELETE", f"{PATH}/{quote(name)}", timeout_s=self._timeout)
        except KubeError as exc:
            if exc.status != 404:
                raise
        self.cache.forget(name)
