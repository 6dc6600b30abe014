"""API client construction from a kubeconfig file or the in-cluster ServiceAccount, the
start-up check that the API server answers, and the bearer token a kubeconfig's user presents
(the operator CLI). The rest of the controller names the client type as
:data:`gpuhealth.controller.kube.rest.ApiClient`: only ``controller/kube`` imports
kubernetes_asyncio.

Both fail with one of our errors, never a library traceback: a kubeconfig that is missing or
invalid (or no in-cluster ServiceAccount) is a :class:`ConfigError`; an API server that does
not answer within ``startup_timeout_s`` a :class:`TransientError`; credentials it rejects a
:class:`PermanentError`. The command line prints them as one line and exits non-zero.
"""

from __future__ import annotations

import os

import msgspec
from kubernetes_asyncio import client, config
from yarl import URL

from gpuhealth.common.clock import Clock, SystemClock
from gpuhealth.common.errors import ConfigError, PermanentError, TransientError
from gpuhealth.controller.aiohttp_internals import environment_proxy, ignore_environment
from gpuhealth.controller.kube.rest import KubeError, request

PROBE_REQUEST_TIMEOUT_S = 5.0
"""Deadline of one ``GET /version`` while waiting for the API server at start."""
PROBE_RETRY_S = 1.0
"""Pause between two start-up probes."""


async def make_api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """Return an ApiClient; in-cluster config re-reads the rotated projected token."""
    cfg = client.Configuration()
    if kubeconfig:
        if not os.path.isfile(kubeconfig):  # noqa: ASYNC240 (once, at start)
            raise ConfigError(f"kubeconfig {kubeconfig}: no such file")
        try:
            await config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        except Exception as exc:  # the library raises many types for one bad file
            raise ConfigError(f"kubeconfig {kubeconfig}: {_one_line(exc)}") from exc
    else:
        try:
            config.load_incluster_config(client_configuration=cfg, try_refresh_token=True)
        except config.ConfigException as exc:
            raise ConfigError(
                f"no --kubeconfig given and no in-cluster ServiceAccount: {_one_line(exc)}"
            ) from exc
    return api_client(cfg)


def api_client(cfg: client.Configuration) -> client.ApiClient:
    """An ApiClient whose HTTP session does not consult the environment on every request.

    kubernetes_asyncio opens its aiohttp session with ``trust_env``: then every request looks
    up ``~/.netrc`` and the proxy variables in a worker thread (two thread hops and a file
    parse per API call, a measured share of the controller's CPU when thousands of agents
    reconnect: bench ``fleet_scale``). The proxy the environment names for the API server
    (``HTTPS_PROXY``/``NO_PROXY``, as client-go honours them) is resolved once, here, unless
    the kubeconfig names one; netrc credentials never apply (every request carries its own
    Authorization header, which aiohttp refuses to combine with them)."""
    proxied = None if cfg.proxy else environment_proxy(URL(cfg.host))
    if proxied is not None:
        proxy, auth = proxied
        cfg.proxy = str(proxy)
        if auth is not None:
            cfg.proxy_headers = {"Proxy-Authorization": auth.encode()}
    api = client.ApiClient(configuration=cfg)
    ignore_environment(api.rest_client.pool_manager)
    return api


async def wait_for_api_server(
    api: client.ApiClient, timeout_s: float, clock: Clock | None = None
) -> str:
    """``GET /version`` until the API server answers; its version. Retried for ``timeout_s``
    (the API server may still be starting); rejected credentials fail at once."""
    clock = clock or SystemClock()
    host = api.configuration.host
    deadline = clock.monotonic() + timeout_s
    while True:
        budget = max(0.1, min(PROBE_REQUEST_TIMEOUT_S, deadline - clock.monotonic()))
        try:
            async with clock.timeout(budget):
                info = await request(api, "GET", "/version")
            return str(info.get("gitVersion", ""))
        except KubeError as exc:
            if isinstance(exc, PermanentError):  # 401, 403, 404: waiting will not help
                raise PermanentError(f"API server {host}: {_one_line(exc)}") from exc
            last = _one_line(exc)
        except TimeoutError:
            last = f"no answer within {budget:g} s"
        except msgspec.DecodeError as exc:
            raise PermanentError(f"{host} is not a Kubernetes API server: {exc}") from exc
        if deadline - clock.monotonic() <= PROBE_RETRY_S:
            raise TransientError(
                f"API server {host} did not answer within {timeout_s:g} s "
                f"(startup_timeout_s): {last}"
            )
        await clock.sleep(PROBE_RETRY_S)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:500]


async def _operator_config(path: str | None, context: str | None) -> client.Configuration:
    """An operator's kubeconfig (``path``, default ``$KUBECONFIG`` or ``~/.kube/config``) at
    ``context`` (default: the current one). Raises ConfigError."""
    cfg = client.Configuration()
    try:
        await config.load_kube_config(
            config_file=path, context=context, client_configuration=cfg, persist_config=False
        )
    except Exception as exc:  # the loader raises many types for one bad file
        where = path or "the default kubeconfig"
        raise ConfigError(f"{where}: {_one_line(exc)[:300]}") from exc
    return cfg


async def operator_api_client(path: str | None, context: str | None) -> client.ApiClient:
    """An ApiClient with an operator's kubeconfig and context (the on-call command). Raises
    ConfigError."""
    return api_client(await _operator_config(path, context))


async def who_am_i(api: client.ApiClient, *, timeout_s: float) -> str:
    """The user name the API server knows the client's credentials as (a SelfSubjectReview,
    which every authenticated user may ask)."""
    review = await request(
        api,
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        timeout_s=timeout_s,
    )
    return str(((review.get("status") or {}).get("userInfo") or {}).get("username") or "")


async def kubeconfig_token(path: str | None, context: str | None) -> str | None:
    """The bearer token the kubeconfig's user presents to the API server (None: that user
    authenticates otherwise, e.g. with a client certificate). Raises ConfigError."""
    cfg = await _operator_config(path, context)
    value = str(cfg.api_key.get("BearerToken") or "")
    scheme, _, token = value.partition(" ")
    return token if scheme.lower() == "bearer" and token else None
