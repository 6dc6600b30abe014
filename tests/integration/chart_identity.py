"""The controller's identity as the chart makes it: its ServiceAccount and RBAC rendered by
``helm template`` (the cached helm binary), applied to the test API server, and a token of
that ServiceAccount (TokenRequest) in a kubeconfig. A controller run with it can do exactly
what the chart grants, so the tests that drive it prove least privilege end to end.

One release per test (a unique release name and namespace, as the chart would be installed):
its controller config (the ``controller.yaml`` the chart renders: key prefix, Lease, breaker
ConfigMap, agent ServiceAccount) is the base of the controller's configuration, and agents
are pods of the release's agent ServiceAccount in the release namespace (:meth:`agent`).
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuhealth.controller.kube.rest import ApiClient, NotFoundError, request
from localkube import AssetsMissing, ControlPlane
from localkube.assets import binary
from localkube.helm import Helm
from localkube.objects import create_pod, request_bound_token
from tests.integration.tooling import missing

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpuhealth"
RBAC = "/apis/rbac.authorization.k8s.io/v1"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
COLLECTIONS = {
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "ClusterRole": f"{RBAC}/clusterroles",
    "ClusterRoleBinding": f"{RBAC}/clusterrolebindings",
    "Role": f"{RBAC}/namespaces/{{ns}}/roles",
    "RoleBinding": f"{RBAC}/namespaces/{{ns}}/rolebindings",
    "ValidatingAdmissionPolicy": f"{ADMISSION}/validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": f"{ADMISSION}/validatingadmissionpolicybindings",
}
"""What the chart's identity is made of (no workloads: the test runs the controller): its
ServiceAccounts, RBAC, and the admission policy that checks who acts on a GPUIncident."""
TOKEN_SECONDS = 3600
KUBE_VERSION = "1.36.3"
"""The test control plane's version (``helm template`` assumes an old one otherwise)."""


@dataclass
class ChartRelease:
    release: str
    namespace: str
    config: dict[str, Any]
    """The controller configuration the chart renders for this release."""
    controller_service_account: str
    kubeconfig: Path
    """Authenticates as the release's controller ServiceAccount."""
    objects: list[tuple[str, str]] = field(default_factory=list)
    """(kind, path) of what was created, for :meth:`delete`."""

    @property
    def agent_service_account(self) -> str:
        return str(self.config["stream"]["agent_service_account"])

    @property
    def controller_fullname(self) -> str:
        """``<fullname>-controller``: the controller's Service, Roles and ClusterRole."""
        return str(self.config["leader"]["service"])

    async def user(self, cp: ControlPlane, api: ApiClient, name: str, role: str = "") -> Path:
        """A kubeconfig of a new ServiceAccount ``name`` of the release namespace, bound in the
        release namespace to the release's ``<fullname>-controller-<role>`` when ``role`` is
        given (the operator Role, the viewer ClusterRole)."""
        ns = self.namespace
        sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}
        await request(api, "POST", f"/api/v1/namespaces/{ns}/serviceaccounts", body=sa)
        if role:
            binding = {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": f"{name}-{role}"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole" if role == "viewer" else "Role",
                    "name": f"{self.controller_fullname}-{role}",
                },
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}],
            }
            await request(api, "POST", f"{RBAC}/namespaces/{ns}/rolebindings", body=binding)
        return cp.token_kubeconfig(await service_account_token(api, ns, name), f"{ns}-{name}")

    async def cluster_user(
        self, cp: ControlPlane, api: ApiClient, name: str, cluster_role: str
    ) -> Path:
        """A kubeconfig of a new ServiceAccount ``name`` of the release namespace, bound to the
        release's ClusterRole ``<fullname>-controller-<cluster_role>`` (``oncall``)."""
        ns = self.namespace
        sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}
        await request(api, "POST", f"/api/v1/namespaces/{ns}/serviceaccounts", body=sa)
        binding_name = f"{ns}-{name}-{cluster_role}"
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": binding_name},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": f"{self.controller_fullname}-{cluster_role}",
            },
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}],
        }
        await request(api, "POST", f"{RBAC}/clusterrolebindings", body=binding)
        self.objects.append(("ClusterRoleBinding", f"{RBAC}/clusterrolebindings/{binding_name}"))
        return cp.token_kubeconfig(await service_account_token(api, ns, name), f"{ns}-{name}")

    @property
    def controller_user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.controller_service_account}"

    async def agent(
        self, api: ApiClient, node: str, audience: str = "gpuhealth"
    ) -> tuple[Any, str]:
        """A pod of the release's agent ServiceAccount on ``node`` and its bound token."""
        sa = self.agent_service_account
        pod = await create_pod(
            api, self.namespace, f"agent-{uuid.uuid4().hex[:6]}", node_name=node, service_account=sa
        )
        return pod, await request_bound_token(api, self.namespace, sa, pod, audience)

    async def delete(self, api: ApiClient) -> None:
        for _, path in reversed(self.objects):
            with contextlib.suppress(NotFoundError):
                await request(api, "DELETE", path)


async def service_account_token(api: ApiClient, namespace: str, name: str) -> str:
    """A TokenRequest token of the ServiceAccount for the API server's own audience."""
    token = await request(
        api,
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
        body={
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": TOKEN_SECONDS},
        },
    )
    return str(token["status"]["token"])


def render(cp: ControlPlane, release: str, namespace: str, values: dict[str, Any]) -> list[Any]:
    try:
        helm_bin = binary(cp.assets, "helm")
    except AssetsMissing as exc:
        missing(f"helm is missing: {exc}")
    helm = Helm(helm_bin, cp.kubeconfig, cp.workdir / "helm-template")
    values_file = helm.workdir / f"{release}.yaml"
    values_file.write_text(yaml.safe_dump(values))
    out = helm.run(
        "template", release, str(CHART), "--namespace", namespace, "--values", str(values_file),
        "--kube-version", KUBE_VERSION,
    )  # fmt: skip
    return [d for d in yaml.safe_load_all(out) if d]


async def install_identity(
    cp: ControlPlane, api: ApiClient, values: dict[str, Any] | None = None
) -> ChartRelease:
    """Render the chart for a new release, create its namespace, ServiceAccounts and RBAC,
    and mint a token of its controller ServiceAccount."""
    suffix = uuid.uuid4().hex[:6]
    release, namespace = f"gh-{suffix}", f"gpuhealth-{suffix}"
    docs = render(cp, release, namespace, values or {})
    await request(
        api,
        "POST",
        "/api/v1/namespaces",
        body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
    )
    created: list[tuple[str, str]] = [("Namespace", f"/api/v1/namespaces/{namespace}")]
    controller_sa = ""
    config: dict[str, Any] = {}
    for doc in docs:
        kind, name = doc["kind"], doc["metadata"]["name"]
        if kind == "ConfigMap" and "controller.yaml" in doc.get("data", {}):
            config = yaml.safe_load(doc["data"]["controller.yaml"])
        if kind == "Deployment":
            controller_sa = doc["spec"]["template"]["spec"]["serviceAccountName"]
        if kind not in COLLECTIONS:
            continue
        collection = COLLECTIONS[kind].format(ns=doc["metadata"].get("namespace") or namespace)
        await request(api, "POST", collection, body=doc)
        created.append((kind, f"{collection}/{name}"))
    assert controller_sa and config, "the chart rendered no controller"
    token = await service_account_token(api, namespace, controller_sa)
    kubeconfig = cp.token_kubeconfig(token, f"{namespace}-{controller_sa}")
    return ChartRelease(release, namespace, config, controller_sa, kubeconfig, created)
