"""Real Kubernetes for integration tests: one etcd + kube-apiserver for the whole session.

Fixtures:
- ``control_plane``: the session's :class:`localkube.ControlPlane` (``.kubeconfig``, ``.url``,
  ``.ca_cert``). Tests share it, so every test uses unique object names (``unique_name``).
- ``api_client``: an admin ``kubernetes_asyncio`` ApiClient on the test's event loop.
- ``node_api_client``: factory ``await node_api_client("node-1")``: an ApiClient acting as
  that node's kubelet (``system:node:node-1`` in ``system:nodes``, a client certificate:
  :meth:`localkube.ControlPlane.node_kubeconfig`), which the Node authorizer and
  NodeRestriction limit; closed when the test ends.
- ``kube_scheduler``: factory ``kube_scheduler(extenders=None, scheduler_name=None)``; each
  scheduler it starts is stopped when the test ends.
- ``kwok``: kwok for the session, started on first use.

Binaries come from GPUHEALTH_ASSETS, KUBEBUILDER_ASSETS or ``hack/kube-binaries.sh``. When
they are missing the tests are skipped, except with ``CI=true``, where that fails the run.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from gpuhealth.controller.incidents.incident_store import PATH as INCIDENTS_PATH
from gpuhealth.controller.kube.client import make_api_client
from gpuhealth.controller.kube.rest import NotFoundError
from gpuhealth.controller.kube.rest import request as rest_request
from gpuhealth.controller.remediation.episode_store import PATH as EPISODES_PATH
from localkube import AssetsMissing, ControlPlane, assets_dir
from localkube.assets import binary
from localkube.kwok import Kwok
from localkube.scheduler import Scheduler
from tests.integration.tooling import missing


def _missing(reason: str) -> NoReturn:
    missing(f"Kubernetes binaries are missing: {reason}")


@pytest.fixture(scope="session")
def kube_assets() -> Path:
    """The binaries' directory, with at least etcd and kube-apiserver in it."""
    try:
        directory = assets_dir()
        binary(directory, "etcd")
        binary(directory, "kube-apiserver")
    except AssetsMissing as exc:
        _missing(str(exc))
    return directory


_startup_key = pytest.StashKey[dict[str, float]]()


@pytest.fixture(scope="session")
def control_plane(kube_assets: Path, pytestconfig: pytest.Config) -> Iterator[ControlPlane]:
    try:
        cp = ControlPlane(kube_assets)
    except AssetsMissing as exc:
        _missing(str(exc))
    with cp:
        pytestconfig.stash[_startup_key] = dict(cp.ready_seconds)
        yield cp


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    ready = config.stash.get(_startup_key, None)
    if ready:
        times = ", ".join(f"{name} ready after {s:.2f}s" for name, s in ready.items())
        terminalreporter.write_line(f"localkube control plane cold start: {times}")


@pytest.fixture(autouse=True)
async def _no_episodes_left(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """After a test on the shared API server, its GPURemediations and GPUIncidents go: every
    controller's loop reads them cluster-wide (a later test's controller would act on another
    test's episode, and escalated ones count against every later test's safety limits; a new
    leader adopts every open incident: another test's domain taint)."""
    yield
    if "control_plane" not in request.fixturenames:
        return
    cp: ControlPlane = request.getfixturevalue("control_plane")
    api = await make_api_client(str(cp.kubeconfig))
    try:
        for path in (EPISODES_PATH, INCIDENTS_PATH):
            with contextlib.suppress(NotFoundError):  # the CRD was never installed
                await rest_request(api, "DELETE", path)
    finally:
        await api.close()


@pytest.fixture
async def api_client(control_plane: ControlPlane) -> AsyncIterator[Any]:
    api = await make_api_client(str(control_plane.kubeconfig))
    try:
        yield api
    finally:
        await api.close()


@pytest.fixture
async def node_api_client(
    control_plane: ControlPlane,
) -> AsyncIterator[Callable[[str], Awaitable[Any]]]:
    made: list[Any] = []

    async def make(node: str) -> Any:
        api = await make_api_client(str(control_plane.node_kubeconfig(node)))
        made.append(api)
        return api

    try:
        yield make
    finally:
        for api in made:
            await api.close()


@pytest.fixture
def kube_scheduler(control_plane: ControlPlane) -> Iterator[Callable[..., Scheduler]]:
    started: list[Scheduler] = []

    def start(
        extenders: list[dict[str, object]] | None = None, scheduler_name: str | None = None
    ) -> Scheduler:
        try:
            sched = control_plane.scheduler(extenders=extenders, scheduler_name=scheduler_name)
        except AssetsMissing as exc:
            _missing(str(exc))
        started.append(sched)
        return sched.start()

    yield start
    for sched in reversed(started):
        sched.stop()


@pytest.fixture(scope="session")
def kwok(control_plane: ControlPlane) -> Iterator[Kwok]:
    try:
        fake = control_plane.kwok()
    except AssetsMissing as exc:
        _missing(str(exc))
    with fake:
        yield fake


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """``unique_name("gpu-node")`` → a DNS-1123 name unique to this test and call."""
    test = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:30].strip("-")

    def make(prefix: str) -> str:
        return f"{prefix[:24].strip('-')}-{test}-{uuid.uuid4().hex[:6]}"

    return make
