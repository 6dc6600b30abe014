"""API client construction from a kubeconfig file or the in-cluster ServiceAccount."""

from __future__ import annotations

from kubernetes_asyncio import client, config


async def make_api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """Return an ApiClient; in-cluster config re-reads the rotated projected token."""
    cfg = client.Configuration()
    if kubeconfig:
        await config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    else:
        config.load_incluster_config(client_configuration=cfg, try_refresh_token=True)
    return client.ApiClient(configuration=cfg)
