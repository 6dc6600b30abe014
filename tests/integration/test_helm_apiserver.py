"""Every object the Helm chart renders (defaults, and every option on) is accepted by a real
kube-apiserver as a server-side dry run, with the test-only monitoring CRDs installed; the
controller's RBAC is checked with SubjectAccessReviews: what it uses, and nothing more."""

from __future__ import annotations

import base64
import functools
import json
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from gpuhealth.controller.names import DEFAULT_PREFIX, Keys
from localkube import ControlPlane
from localkube.helm import Helm
from localkube.objects import gpu_node_body
from localkube.process import free_port
from tests.integration.test_helm import (
    ALL_OPTIONS,
    CHART,
    HELM_TIMEOUT_S,
    ROOT,
    SHARDED,
    helm,
    one,
    render,
)
from tests.support.wait import until

pytestmark = pytest.mark.integration

__all__ = ["helm"]  # the fixture, shared with test_helm.py

CRDS = ROOT / "deploy" / "crds-for-tests"
IDENTITY_KINDS = frozenset(
    {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
)
CRD_ESTABLISHED_TIMEOUT_S = 30.0


@dataclass
class Kube:
    """A tiny dynamic client: discovery plus POST, authenticated as the test admin."""

    url: str
    context: ssl.SSLContext

    def request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, dict[str, Any]]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", content_type)
        req.add_header("Accept", "application/json")
        try:
            with urllib.request.urlopen(req, context=self.context, timeout=30) as resp:
                return resp.status, json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    def resource(self, api_version: str, kind: str) -> tuple[str, bool]:
        """(collection path prefix, namespaced) for a kind, from discovery."""
        base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        status, doc = self.request("GET", base)
        assert status == 200, (api_version, doc)
        for res in doc["resources"]:
            if res["kind"] == kind and "/" not in res["name"]:
                return f"{base}/{res['name']}", bool(res["namespaced"])
        raise AssertionError(f"{api_version} {kind} is not served")

    def collection(self, obj: dict[str, Any], namespace: str) -> str:
        prefix, namespaced = self.resource(obj["apiVersion"], obj["kind"])
        if not namespaced:
            return prefix
        base, plural = prefix.rsplit("/", 1)
        return f"{base}/namespaces/{namespace}/{plural}"

    def create(self, obj: dict[str, Any], namespace: str, dry_run: bool) -> tuple[int, Any]:
        query = "?fieldManager=test" + ("&dryRun=All" if dry_run else "")
        return self.request("POST", self.collection(obj, namespace) + query, obj)

    def create_identities(self, docs: list[dict[str, Any]], namespace: str) -> None:
        """The release's ServiceAccounts and RBAC, for SubjectAccessReviews about them."""
        for obj in docs:
            if obj["kind"] in IDENTITY_KINDS:
                status, body = self.create(obj, namespace, dry_run=False)
                assert status == 201, body

    def allowed(
        self,
        user: str,
        verb: str,
        resource: str,
        group: str = "",
        *,
        sa_namespace: str,
        **attrs: str,
    ) -> bool:
        """A SubjectAccessReview for ``user``, a ServiceAccount of ``sa_namespace``."""
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user,
                "groups": ["system:serviceaccounts", f"system:serviceaccounts:{sa_namespace}"],
                "resourceAttributes": {"verb": verb, "resource": resource, "group": group, **attrs},
            },
        }
        status, body = self.create(review, "", dry_run=False)
        assert status == 201, body
        return bool(body["status"].get("allowed"))

    def apply(self, obj: dict[str, Any], namespace: str) -> tuple[int, Any]:
        """Server-side apply, as Argo CD (``ServerSideApply=true``) and Flux sync."""
        path = f"{self.collection(obj, namespace)}/{obj['metadata']['name']}"
        query = "?fieldManager=gitops&force=true"
        return self.request("PATCH", path + query, obj, "application/apply-patch+yaml")

    def remove_cluster_scoped(self, docs: list[dict[str, Any]]) -> None:
        """Delete the cluster-scoped objects of ``docs`` a test applied, CRDs aside (shared with
        other tests). A namespace's deletion leaves them, and a release's admission policy left
        behind would judge every later test's GPUIncident writes."""
        for obj in docs:
            if obj["kind"] == "CustomResourceDefinition":
                continue
            prefix, namespaced = self.resource(obj["apiVersion"], obj["kind"])
            if not namespaced:
                status, body = self.request("DELETE", f"{prefix}/{obj['metadata']['name']}")
                assert status in (200, 202, 404), body

    def replace_dry_run(self, obj: dict[str, Any]) -> tuple[int, Any]:
        """A server-side dry run of replacing the cluster-scoped ``obj`` that exists (what an
        upgrade does to a CRD an earlier install left)."""
        path = f"{self.collection(obj, '')}/{obj['metadata']['name']}"
        status, current = self.request("GET", path)
        if status != 200:
            return status, current
        meta = {**obj["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}
        return self.request(
            "PUT", path + "?fieldManager=test&dryRun=All", {**obj, "metadata": meta}
        )


@pytest.fixture(scope="module")
def kube(control_plane: ControlPlane) -> Iterator[Kube]:
    context = ssl.create_default_context(cafile=str(control_plane.ca_cert))
    context.load_cert_chain(str(control_plane.pki.admin_cert), str(control_plane.pki.admin_key))
    client = Kube(control_plane.url, context)
    for path in sorted(CRDS.glob("*.yaml")):
        status, body = client.create(yaml.safe_load(path.read_text()), "", dry_run=False)
        assert status in (201, 409), body
    deadline = time.monotonic() + CRD_ESTABLISHED_TIMEOUT_S
    while True:
        status, doc = client.request("GET", "/apis/monitoring.coreos.com/v1")
        kinds = {r["kind"] for r in doc.get("resources", [])} if status == 200 else set()
        if {"ServiceMonitor", "PodMonitor", "PrometheusRule"} <= kinds:
            break
        assert time.monotonic() < deadline, f"monitoring CRDs not served: {status} {doc}"
        time.sleep(0.2)
    yield client


@pytest.fixture
def namespace(kube: Kube, unique_name: Callable[[str], str]) -> str:
    name = unique_name("helm")
    status, body = kube.create(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}, "", dry_run=False
    )
    assert status == 201, body
    return name


@pytest.mark.parametrize(
    "values", [{}, ALL_OPTIONS, SHARDED], ids=["defaults", "all-options", "shards"]
)
def test_every_rendered_object_is_accepted_by_the_api_server(
    helm: str, kube: Kube, namespace: str, tmp_path: Path, values: dict[str, Any]
) -> None:
    docs = render(helm, tmp_path, values, release="gpuhealth", ns=namespace)
    assert len(docs) >= 12
    refused = []
    for obj in docs:
        status, body = kube.create(obj, namespace, dry_run=True)
        if status == 409 and obj["kind"] == "CustomResourceDefinition":
            status, body = kube.replace_dry_run(obj)  # installed by earlier tests: as upgraded
        if status not in (200, 201):
            refused.append((obj["kind"], obj["metadata"]["name"], status, body.get("message")))
    assert refused == []


def test_the_api_server_refuses_a_broken_object(kube: Kube, namespace: str) -> None:
    """The dry run really validates: an invalid DaemonSet is refused."""
    broken = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "broken"},
        "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {"spec": {}}},
    }
    status, _ = kube.create(broken, namespace, dry_run=True)
    assert status == 422


def test_controller_service_account_can_do_what_it_uses_and_no_more(
    helm: str, kube: Kube, namespace: str, tmp_path: Path
) -> None:
    release = f"gh-{namespace[-6:]}"
    kube.create_identities(render(helm, tmp_path, {}, release=release, ns=namespace), namespace)
    controller = f"system:serviceaccount:{namespace}:{release}-gpuhealth-controller"
    agent = f"system:serviceaccount:{namespace}:{release}-gpuhealth-agent"
    lease = f"{release}-gpuhealth-controller"

    allowed = functools.partial(kube.allowed, sa_namespace=namespace)

    assert allowed(controller, "patch", "nodes")
    assert allowed(controller, "patch", "nodes", subresource="status")
    assert allowed(controller, "create", "tokenreviews", "authentication.k8s.io")
    assert allowed(controller, "create", "subjectaccessreviews", "authorization.k8s.io")
    assert allowed(controller, "create", "events", namespace="default")
    assert allowed(controller, "create", "devicetaintrules", "resource.k8s.io")
    assert allowed(
        controller, "update", "leases", "coordination.k8s.io", namespace=namespace, name=lease
    )
    breaker = f"{release}-gpuhealth-breaker"
    assert allowed(controller, "patch", "configmaps", namespace=namespace, name=breaker)
    # The leader's endpoint: its own slice only, and only for its own Service.
    service = f"{release}-gpuhealth-controller"
    assert allowed(controller, "get", "services", namespace=namespace, name=service)
    assert not allowed(controller, "get", "services", namespace=namespace, name="other")
    slices = "discovery.k8s.io"
    assert allowed(controller, "create", "endpointslices", slices, namespace=namespace)
    assert allowed(
        controller, "patch", "endpointslices", slices, namespace=namespace, name=f"{service}-leader"
    )
    assert not allowed(controller, "patch", "endpointslices", slices, namespace=namespace, name="x")
    assert not allowed(controller, "create", "endpointslices", slices, namespace="default")
    assert not allowed(controller, "patch", "configmaps", namespace=namespace, name="other")
    assert allowed(controller, "watch", "pods", namespace=namespace)  # the agent pods
    assert not allowed(controller, "watch", "pods", namespace="default")
    assert not allowed(controller, "delete", "nodes")
    assert not allowed(controller, "update", "nodes")
    assert not allowed(controller, "get", "secrets", namespace=namespace)
    assert not allowed(controller, "patch", "pods", namespace="default")
    # Loop off: the stored episodes are read (their quarantine stays), never written.
    for verb in ("get", "list", "watch"):
        assert allowed(controller, verb, "gpuremediations", "gpuhealth.io")
    for verb in ("create", "delete"):
        assert not allowed(controller, verb, "gpuremediations", "gpuhealth.io")
    assert not allowed(
        controller, "update", "gpuremediations", "gpuhealth.io", subresource="status", name="x"
    )
    assert not allowed(controller, "create", "pods", namespace="x", subresource="eviction")
    # Incidents: the controller writes them and their status, never updates the object
    # (on-call's spec); on-call acts on them, never on their status or any Node.
    for verb in ("get", "list", "watch", "create", "patch", "delete"):
        assert allowed(controller, verb, "gpuincidents", "gpuhealth.io")
    assert allowed(controller, "update", "gpuincidents", "gpuhealth.io", subresource="status")
    assert not allowed(controller, "update", "gpuincidents", "gpuhealth.io")
    oncall = f"system:serviceaccount:{namespace}:sre"
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": f"{release}-oncall-test"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": f"{release}-gpuhealth-controller-oncall",
        },
        "subjects": [{"kind": "ServiceAccount", "name": "sre", "namespace": namespace}],
    }
    status, body = kube.create(binding, "", dry_run=False)
    assert status == 201, body
    for verb in ("get", "list", "watch", "patch", "update"):
        assert allowed(oncall, verb, "gpuincidents", "gpuhealth.io")
    assert allowed(oncall, "list", "gpuremediations", "gpuhealth.io")
    assert not allowed(oncall, "update", "gpuincidents", "gpuhealth.io", subresource="status")
    assert not allowed(oncall, "patch", "gpuincidents", "gpuhealth.io", subresource="status")
    assert not allowed(oncall, "delete", "gpuincidents", "gpuhealth.io")
    assert not allowed(oncall, "create", "gpuincidents", "gpuhealth.io")
    for verb in ("get", "list", "patch"):
        assert not allowed(oncall, verb, "nodes")
    assert not allowed(oncall, "patch", "gpuremediations", "gpuhealth.io")
    assert not allowed(
        controller, "update", "leases", "coordination.k8s.io", namespace=namespace, name="other"
    )
    assert not allowed(
        controller, "update", "leases", "coordination.k8s.io", namespace="kube-system", name=lease
    )
    for verb, resource in (("get", "nodes"), ("list", "pods"), ("create", "tokenreviews")):
        assert not allowed(agent, verb, resource), f"agent must have no RBAC ({verb} {resource})"
    # The uninstall hook's own account: stop the controller, then remove what it wrote.
    cleanup = f"system:serviceaccount:{namespace}:{release}-gpuhealth-cleanup"
    apps, dra = "apps", "resource.k8s.io"
    assert allowed(cleanup, "patch", "deployments", apps, namespace=namespace, name=service)
    assert not allowed(cleanup, "patch", "deployments", apps, namespace=namespace, name="other")
    assert not allowed(cleanup, "delete", "deployments", apps, namespace=namespace, name=service)
    assert allowed(cleanup, "list", "pods", namespace=namespace)
    assert not allowed(cleanup, "list", "pods", namespace="default")
    assert not allowed(cleanup, "patch", "pods", namespace="default")  # no idle annotations
    assert allowed(cleanup, "get", "leases", "coordination.k8s.io", namespace=namespace, name=lease)
    assert allowed(cleanup, "list", "nodes") and allowed(cleanup, "patch", "nodes")
    assert allowed(cleanup, "patch", "nodes", subresource="status")
    assert not allowed(cleanup, "delete", "nodes") and not allowed(cleanup, "update", "nodes")
    assert allowed(cleanup, "delete", "devicetaintrules", dra)
    assert not allowed(cleanup, "create", "devicetaintrules", dra)
    assert allowed(
        cleanup, "delete", "endpointslices", slices, namespace=namespace, name=f"{service}-leader"
    )
    assert not allowed(cleanup, "delete", "endpointslices", slices, namespace=namespace, name="x")
    assert not allowed(cleanup, "get", "secrets", namespace=namespace)
    # Nobody may reset the breaker until bound to the operator Role, and then only this one.
    reset = {"verb": "update", "resource": "circuitbreakers", "group": "gpuhealth.io"}
    assert not allowed(controller, **reset, namespace=namespace)
    assert not allowed(agent, **reset, namespace=namespace)
    status, body = kube.create(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "ops"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": f"{release}-gpuhealth-controller-operator",
            },
            "subjects": [{"kind": "User", "name": "ops", "apiGroup": "rbac.authorization.k8s.io"}],
        },
        namespace,
        dry_run=False,
    )
    assert status == 201, body
    assert allowed("ops", **reset, namespace=namespace)
    assert allowed("ops", "get", "fleet", "gpuhealth.io", namespace=namespace)
    assert not allowed("ops", **reset, namespace="default")


def test_with_shards_the_controller_reaches_each_shards_objects_by_name_and_no_more(
    helm: str, kube: Kube, namespace: str, tmp_path: Path
) -> None:
    """shards.count=3: each shard's Lease, breaker ConfigMap, Service and owner's slice by
    name, the shard sizes' ConfigMap; nothing of a shard the release does not have."""
    release = f"sh-{namespace[-6:]}"
    kube.create_identities(
        render(helm, tmp_path, SHARDED, release=release, ns=namespace), namespace
    )
    controller = f"system:serviceaccount:{namespace}:{release}-gpuhealth-controller"
    allowed = functools.partial(kube.allowed, controller, sa_namespace=namespace)
    lease, service = f"{release}-gpuhealth-controller", f"{release}-gpuhealth-controller"
    breaker, slices, leases = (
        f"{release}-gpuhealth-breaker",
        "discovery.k8s.io",
        "coordination.k8s.io",
    )
    for i in range(3):
        for verb in ("get", "update"):
            assert allowed(verb, "leases", leases, namespace=namespace, name=f"{lease}-shard-{i}")
        assert allowed("patch", "configmaps", namespace=namespace, name=f"{breaker}-shard-{i}")
        assert allowed("get", "services", namespace=namespace, name=f"{service}-shard-{i}")
        assert allowed(
            "patch",
            "endpointslices",
            slices,
            namespace=namespace,
            name=f"{service}-shard-{i}-leader",
        )
    assert allowed("patch", "configmaps", namespace=namespace, name="gpuhealth-shards")
    assert allowed("update", "leases", leases, namespace=namespace, name=lease)  # the singleton
    assert not allowed("update", "leases", leases, namespace=namespace, name=f"{lease}-shard-3")
    assert not allowed("patch", "configmaps", namespace=namespace, name=f"{breaker}-shard-3")
    assert not allowed("delete", "configmaps", namespace=namespace, name="gpuhealth-shards")
    assert not allowed(
        "patch", "endpointslices", slices, namespace=namespace, name=f"{service}-shard-3-leader"
    )
    assert not allowed("update", "nodes") and not allowed("delete", "nodes")
    assert allowed("patch", "nodes")  # the shard label, the owners' taints: as before


def test_remediation_rbac_is_granted_only_when_it_is_on(
    helm: str, kube: Kube, namespace: str, tmp_path: Path
) -> None:
    """Off (the default): GPURemediations read only, no eviction or PDB permission. On:
    exactly what the loop uses — and still no pod delete (only with forceDelete), no pod
    create outside the validation namespace, no NodeClaim or Node delete (only with
    replacePools), nothing for the agent."""
    release = f"gr-{namespace[-6:]}"
    values = {"remediation": {"enabled": True, "validationPodNamespace": namespace}}
    kube.create_identities(render(helm, tmp_path, values, release=release, ns=namespace), namespace)
    controller = f"system:serviceaccount:{namespace}:{release}-gpuhealth-controller"
    agent = f"system:serviceaccount:{namespace}:{release}-gpuhealth-agent"

    allowed = functools.partial(kube.allowed, sa_namespace=namespace)

    for verb in ("get", "list", "watch", "create", "delete"):
        assert allowed(controller, verb, "gpuremediations", "gpuhealth.io")
    assert allowed(
        controller, "update", "gpuremediations", "gpuhealth.io", subresource="status", name="x"
    )
    assert not allowed(controller, "patch", "gpuremediations", "gpuhealth.io")
    assert allowed(controller, "list", "pods", namespace="team-a")
    assert allowed(controller, "create", "pods", namespace="team-a", subresource="eviction")
    assert allowed(controller, "list", "poddisruptionbudgets", "policy", namespace="team-a")
    assert not allowed(controller, "delete", "pods", namespace="team-a")
    assert not allowed(controller, "create", "pods", namespace="team-a")
    assert allowed(controller, "create", "pods", namespace=namespace)  # the validation pod
    # The uninstall hook deletes the validation pods, there only.
    cleanup = f"system:serviceaccount:{namespace}:{release}-gpuhealth-cleanup"
    assert allowed(cleanup, "delete", "pods", namespace=namespace)
    assert not allowed(cleanup, "delete", "pods", namespace="team-a")
    assert not allowed(controller, "delete", "poddisruptionbudgets", "policy", namespace="a")
    # No replacement pool: no NodeClaim or Node delete (remediation.replacePools grants them,
    # each only for its method; test_remediation_cluster.py drives them as this identity).
    assert not allowed(controller, "delete", "nodeclaims", "karpenter.sh")
    assert not allowed(controller, "get", "nodeclaims", "karpenter.sh")
    assert not allowed(controller, "delete", "nodes")
    assert allowed(controller, "patch", "nodes")  # the cordon and the autoscalers' annotations
    for verb, resource, group in (
        ("create", "gpuremediations", "gpuhealth.io"),
        ("list", "pods", ""),
        ("create", "pods/eviction", ""),
    ):
        assert not allowed(agent, verb, resource, group), f"agent: {verb} {resource}"


def helm_deploy(
    client: Helm, verb: str, release: str, namespace: str, values: dict[str, Any]
) -> None:
    """``helm install`` (into a new namespace) or ``helm upgrade`` with ``values``. No --wait:
    this API server has no kubelet to run the pods. The CRDs are cluster-wide and shared with
    other tests: not installed."""
    path = client.workdir / f"values-{verb}-{len(list(client.workdir.glob('values-*')))}.yaml"
    crds_off = {"remediation": {"installCRD": False}, "incidents": {"installCRD": False}}
    path.write_text(yaml.safe_dump({**values, **crds_off}))
    extra = ["--create-namespace"] if verb == "install" else []
    client.run(verb, release, str(CHART), "--namespace", namespace, *extra,
               "--values", str(path), timeout_s=HELM_TIMEOUT_S)  # fmt: skip


def test_the_generated_certificate_is_kept_across_upgrades(
    helm: str, kube: Kube, control_plane: ControlPlane, unique_name: Callable[[str], str]
) -> None:
    """helm install, then helm upgrade with other values against the real API server: the
    chart reads its Secret back (lookup) and renders the same CA and certificate, so the
    pods' checksum/tls does not change (no restart for TLS). Deleting the Secret and
    upgrading rotates them (README "TLS")."""
    namespace = unique_name("tls")
    release = f"tls-{namespace[-6:]}"
    client = Helm(Path(helm), control_plane.kubeconfig, control_plane.workdir / f"helm-{release}")
    secret_path = f"/api/v1/namespaces/{namespace}/secrets/{release}-gpuhealth-controller-tls"
    ca_path = f"/api/v1/namespaces/{namespace}/configmaps/{release}-gpuhealth-controller-ca"
    deploy_path = f"/apis/apps/v1/namespaces/{namespace}/deployments/{release}-gpuhealth-controller"
    agent_path = f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{release}-gpuhealth-agent"

    def deploy(replicas: int) -> None:
        verb = "install" if replicas == 2 else "upgrade"
        helm_deploy(client, verb, release, namespace, {"controller": {"replicas": replicas}})

    def state() -> tuple[dict[str, str], str, str, str]:
        statuses = []
        docs = []
        for path in (secret_path, ca_path, deploy_path, agent_path):
            status, doc = kube.request("GET", path)
            statuses.append(status)
            docs.append(doc)
        assert statuses == [200] * 4, statuses
        secret, ca, dep, ds = docs
        checksum = dep["spec"]["template"]["metadata"]["annotations"]["checksum/tls"]
        assert ds["spec"]["template"]["metadata"]["annotations"]["checksum/tls"] == checksum
        return secret["data"], ca["data"]["ca.crt"], checksum, str(dep["spec"]["replicas"])

    try:
        deploy(2)
        installed, ca, checksum, replicas = state()
        assert replicas == "2"
        assert set(installed) == {"ca.crt", "tls.crt", "tls.key"}
        assert base64.b64decode(installed["ca.crt"]).decode() == ca
        deploy(3)
        upgraded, ca_after, checksum_after, replicas = state()
        assert replicas == "3"  # the upgrade did apply
        assert upgraded == installed and ca_after == ca and checksum_after == checksum
        # Rotation: without the Secret the next upgrade generates a new pair.
        status, body = kube.request("DELETE", secret_path)
        assert status == 200, body
        deploy(4)
        rotated, ca_rotated, checksum_rotated, _ = state()
        assert rotated["tls.crt"] != installed["tls.crt"] and ca_rotated != ca
        assert base64.b64decode(rotated["ca.crt"]).decode() == ca_rotated
        assert checksum_rotated != checksum
    finally:
        client.run("uninstall", release, "--namespace", namespace, "--no-hooks",
                   timeout_s=HELM_TIMEOUT_S)  # fmt: skip


def test_going_to_shards_gives_the_generated_certificate_the_shards_names_once(
    helm: str, kube: Kube, control_plane: ControlPlane, unique_name: Callable[[str], str]
) -> None:
    """helm upgrade from one shard to three against the real API server: the certificate read
    back lacks the shards' Services, so the chart makes one that names them (the agents verify
    the shard host they dial); the next upgrade with three shards keeps it."""
    namespace = unique_name("shtls")
    release = f"sht-{namespace[-6:]}"
    client = Helm(Path(helm), control_plane.kubeconfig, control_plane.workdir / f"helm-{release}")
    secret_path = f"/api/v1/namespaces/{namespace}/secrets/{release}-gpuhealth-controller-tls"

    def deploy(verb: str, shards: int, replicas: int) -> dict[str, Any]:
        values = {"shards": {"count": shards}, "controller": {"replicas": replicas}}
        helm_deploy(client, verb, release, namespace, values)
        status, secret = kube.request("GET", secret_path)
        assert status == 200, secret
        return secret

    def names(secret: dict[str, Any]) -> set[str]:
        cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        return set(san.get_values_for_type(x509.DNSName))

    shard_hosts = {f"{release}-gpuhealth-controller-shard-{i}.{namespace}.svc" for i in range(3)}
    try:
        single = deploy("install", 1, 2)
        assert not shard_hosts & names(single)
        sharded = deploy("upgrade", 3, 4)
        assert shard_hosts <= names(sharded)
        assert f"{release}-gpuhealth-controller.{namespace}.svc" in names(sharded)
        assert sharded["metadata"]["annotations"]["gpuhealth.io/tls-shards"] == "3"
        assert deploy("upgrade", 3, 5)["data"] == sharded["data"]  # kept from then on
    finally:
        client.run("uninstall", release, "--namespace", namespace, "--no-hooks",
                   timeout_s=HELM_TIMEOUT_S)  # fmt: skip


SCHEDULE_TIMEOUT_S = 30.0
OLD_TOLERATED = ("unhealthy", "degraded")
"""The chart's tolerations of gpuhealth's taints before the agent tolerated every one."""


def test_an_agent_pod_schedules_onto_a_node_carrying_each_of_our_taints(
    helm: str,
    kube: Kube,
    namespace: str,
    tmp_path: Path,
    kube_scheduler: Callable[..., Any],
    unique_name: Callable[[str], str],
) -> None:
    """The agent DaemonSet's pod, as the DaemonSet controller makes it (the template, pinned to
    its node by node affinity), is scheduled by the real kube-scheduler onto a GPU node that
    carries any one of the taints gpuhealth writes (a hard effect each), and onto one carrying
    all of them: a rolling upgrade re-creates the agent on a quarantined node or one of a
    tainted NVLink domain, and its report is what lifts the taint. The same pod with the
    chart's old tolerations stays Pending on a quarantined node."""
    docs = render(helm, tmp_path, {}, release="gpuhealth", ns=namespace)
    for obj in docs:
        if obj["kind"] == "ServiceAccount":
            status, body = kube.create(obj, namespace, dry_run=False)
            assert status == 201, body
    template = one(docs, "DaemonSet", "gpuhealth-agent")["spec"]["template"]
    scheduler = kube_scheduler(scheduler_name=unique_name("sched"))
    keys = Keys().taint_keys()
    effects = {keys[0]: "NoExecute"}  # the unhealthy taint may evict (policy.noexecute_codes)
    carried = {
        unique_name(key.rsplit("/", 1)[1]): [
            {"key": key, "value": "x", "effect": effects.get(key, "NoSchedule")}
        ]
        for key in keys
    }
    carried[unique_name("all-of-them")] = [
        {"key": key, "value": "x", "effect": "NoSchedule"} for key in keys
    ]
    quarantined = unique_name("old-tolerations")
    carried[quarantined] = [{"key": Keys().quarantine_taint, "value": "x", "effect": "NoSchedule"}]

    def pod_name(node: str) -> str:
        return f"agent-{node}"[:63].rstrip("-")

    def pod(node: str, spec: dict[str, Any]) -> dict[str, Any]:
        affinity = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                }
            }
        }
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod_name(node), "labels": template["metadata"]["labels"]},
            "spec": {**spec, "affinity": affinity, "schedulerName": scheduler.scheduler_name},
        }

    old_spec = {
        **template["spec"],
        "tolerations": [
            t
            for t in template["spec"]["tolerations"]
            if not str(t.get("key", "")).startswith(f"{DEFAULT_PREFIX}/")
            or t["key"].rsplit("/", 1)[1] in OLD_TOLERATED
        ],
    }
    try:
        for node, taints in carried.items():
            status, body = kube.create(
                gpu_node_body(node, kwok=False, taints=taints), "", dry_run=False
            )
            assert status == 201, body
            status, body = kube.create(
                pod(node, old_spec if node == quarantined else template["spec"]),
                namespace,
                dry_run=False,
            )
            assert status == 201, body

        def placement(node: str) -> tuple[str, str]:
            """(the node it is bound to, the PodScheduled condition's reason)."""
            path = f"/api/v1/namespaces/{namespace}/pods/{pod_name(node)}"
            status, body = kube.request("GET", path)
            assert status == 200, (path, body)
            reasons = [
                c.get("reason", "")
                for c in body.get("status", {}).get("conditions") or []
                if c["type"] == "PodScheduled"
            ]
            return body["spec"].get("nodeName", ""), "".join(reasons)

        deadline = time.monotonic() + SCHEDULE_TIMEOUT_S
        expected = {n: n for n in carried if n != quarantined}
        while {n: placement(n)[0] for n in expected} != expected:
            assert time.monotonic() < deadline, {n: placement(n) for n in carried}
            time.sleep(0.2)
        while placement(quarantined)[1] != "Unschedulable":
            assert time.monotonic() < deadline, placement(quarantined)
            time.sleep(0.2)
        assert placement(quarantined)[0] == ""
    finally:
        for node in carried:
            kube.request("DELETE", f"/api/v1/nodes/{node}")


async def test_the_controller_generated_certificate_survives_render_and_sync_twice(
    helm: str,
    kube: Kube,
    namespace: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    control_plane: ControlPlane,
) -> None:
    """controller.tls.generatedBy: controller as Argo CD or Flux run it: ``helm template`` twice
    gives the same manifests (no generated material, no checksum), and syncing them twice
    (server-side apply) changes no pod template, so nothing restarts. The real controller run
    with the rendered configuration creates its CA and certificate once, in a Secret no
    render holds, and publishes the CA; a second replica (or a restart) serves the same
    certificate; further syncs leave the Secret and the CA as they are. Before, every render
    generated a new CA and certificate and its checksum restarted every pod."""
    release = f"go-{namespace[-6:]}"
    values = {
        "controller": {"tls": {"generatedBy": "controller"}},
        "remediation": {"installCRD": False},
    }
    docs = render(helm, tmp_path, values, release=release, ns=namespace)
    assert render(helm, tmp_path, values, release=release, ns=namespace) == docs
    synced = [d for d in docs if "helm.sh/hook" not in (d["metadata"].get("annotations") or {})]
    assert not [d for d in synced if d["kind"] == "Secret"]
    fullname = f"{release}-gpuhealth-controller"
    workloads = {
        "Deployment": f"/apis/apps/v1/namespaces/{namespace}/deployments/{fullname}",
        "DaemonSet": f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{release}-gpuhealth-agent",
    }
    secret_path = f"/api/v1/namespaces/{namespace}/secrets/{fullname}-certificate"
    ca_path = f"/api/v1/namespaces/{namespace}/configmaps/{fullname}-ca"

    def sync() -> dict[str, Any]:
        for obj in synced:
            status, body = kube.apply(obj, namespace)
            assert status in (200, 201), (obj["kind"], obj["metadata"]["name"], body)
        state = {}
        for kind, path in workloads.items():
            status, body = kube.request("GET", path)
            assert status == 200, body
            state[kind] = (body["metadata"]["generation"], body["spec"]["template"])
        return state

    request.addfinalizer(lambda: kube.remove_cluster_scoped(synced))
    first = sync()
    assert sync() == first  # the second sync changes no pod template: nothing restarts
    config = yaml.safe_load(
        next(d for d in docs if d["metadata"]["name"] == fullname and d["kind"] == "ConfigMap")[
            "data"
        ]["controller.yaml"]
    )

    def served_by(port: int, ca_pem: str) -> bytes:
        ctx = ssl.create_default_context(cadata=ca_pem)
        host = f"{fullname}.{namespace}.svc"  # the certificate is for the Service's name
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            ctx.wrap_socket(raw, server_hostname=host) as tls,
        ):
            der = tls.getpeercert(binary_form=True)
        assert der is not None
        return der

    async def replica(name: str) -> tuple[subprocess.Popen[bytes], int]:
        port = free_port()
        files = tmp_path / name
        files.mkdir()
        cfg = {
            **config,
            "kubeconfig": str(control_plane.kubeconfig),
            "listen": f"127.0.0.1:{port}",
            "leader": {**config["leader"], "service": ""},
            "tls_cert_file": str(files / "tls.crt"),
            "tls_key_file": str(files / "tls.key"),
            "log_format": "json",
        }
        (files / "controller.yaml").write_text(yaml.safe_dump(cfg))
        with (files / "controller.log").open("w") as log:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gpuhealth.controller.cli",
                    "--config",
                    str(files / "controller.yaml"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
                env={**os.environ, "PYTHONPATH": str(Path.cwd())},
            )

        async def listening() -> bool | None:
            assert proc.poll() is None, (files / "controller.log").read_text()[-3000:]
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except OSError:
                return None
            return True

        await until(listening, f"{name} listening", timeout_s=30)
        return proc, port

    procs: list[subprocess.Popen[bytes]] = []
    try:
        proc, port = await replica("replica-a")
        procs.append(proc)
        status, secret = kube.request("GET", secret_path)
        assert status == 200, secret
        assert secret["type"] == "kubernetes.io/tls"
        assert (
            secret["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpuhealth-controller"
        )
        status, ca_map = kube.request("GET", ca_path)
        assert status == 200 and set(ca_map["data"]) == {"ca.crt"}
        ca_pem = ca_map["data"]["ca.crt"]
        assert base64.b64decode(secret["data"]["ca.crt"]).decode() == ca_pem
        assert "PRIVATE KEY" not in ca_pem  # the CA alone for the agents
        cert = ssl.PEM_cert_to_DER_cert(base64.b64decode(secret["data"]["tls.crt"]).decode())
        assert served_by(port, ca_pem) == cert
        version = secret["metadata"]["resourceVersion"]

        proc, port_b = await replica("replica-b")  # the other replica, or a restart
        procs.append(proc)
        assert served_by(port_b, ca_pem) == cert
        assert sync() == first and sync() == first  # Argo CD syncs again, twice
        status, after = kube.request("GET", secret_path)
        assert after["metadata"]["resourceVersion"] == version  # created once, never again
        assert kube.request("GET", ca_path)[1]["data"]["ca.crt"] == ca_pem
        assert served_by(port, ca_pem) == served_by(port_b, ca_pem) == cert
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=20)


@pytest.mark.parametrize(
    ("values", "kept", "publishes"),
    [
        ({}, False, False),
        ({"controller": {"tls": {"generatedBy": "controller"}}}, True, True),
        ({"controller": {"tls": {"secretName": "mine"}}}, False, True),
    ],
    ids=["generated-by-the-chart", "generated-by-the-controller", "own-secret"],
)
def test_the_controllers_certificate_rights_are_exactly_its_modes(
    helm: str,
    kube: Kube,
    namespace: str,
    tmp_path: Path,
    values: dict[str, Any],
    kept: bool,
    publishes: bool,
) -> None:
    """The Secret it keeps (generatedBy: controller) by name only, and the CA ConfigMap it
    publishes by name only; nothing of the kind where the chart renders them."""
    release = f"cr-{namespace[-6:]}"
    kube.create_identities(render(helm, tmp_path, values, release=release, ns=namespace), namespace)
    controller = f"system:serviceaccount:{namespace}:{release}-gpuhealth-controller"
    fullname = f"{release}-gpuhealth-controller"

    def allowed(verb: str, resource: str, name: str = "") -> bool:
        return kube.allowed(
            controller, verb, resource, sa_namespace=namespace, namespace=namespace, name=name
        )

    assert allowed("create", "secrets") is kept
    for verb in ("get", "update"):
        assert allowed(verb, "secrets", f"{fullname}-certificate") is kept
        assert not allowed(verb, "secrets", "mine")  # never the user's, never another
        assert not allowed(verb, "secrets", f"{fullname}-tls")
    assert not allowed("list", "secrets") and not allowed("delete", "secrets", "x")
    for verb in ("get", "patch"):
        assert allowed(verb, "configmaps", f"{fullname}-ca") is publishes
    assert not allowed("patch", "configmaps", "kube-root-ca.crt")


async def test_the_breaker_survives_helm_upgrade_force(
    helm: str, kube: Kube, control_plane: ControlPlane, unique_name: Callable[[str], str]
) -> None:
    """``helm upgrade --force`` replaces every object of the release with its rendering. The
    breaker's ConfigMap is not one (the controller creates it, the uninstall hook deletes it),
    so an open breaker and its window survive: before, the chart rendered it empty, the
    replacement emptied it, and the leader read the emptied state as an operator's reset."""
    from gpuhealth.controller.breaker.store import BreakerStore, StoredBreaker, WindowEntry
    from gpuhealth.controller.kube.client import make_api_client

    namespace = unique_name("force")
    release = f"fo-{namespace[-6:]}"
    client = Helm(Path(helm), control_plane.kubeconfig, control_plane.workdir / f"helm-{release}")
    name = f"{release}-gpuhealth-breaker"

    def deploy(verb: str, replicas: int, *flags: str) -> None:
        values = client.workdir / f"values-{replicas}.yaml"
        values.write_text(
            yaml.safe_dump(
                {
                    "controller": {"replicas": replicas},
                    "remediation": {"installCRD": False},
                    "incidents": {"installCRD": False},
                }
            )
        )
        extra = ["--create-namespace"] if verb == "install" else []
        client.run(verb, release, str(CHART), "--namespace", namespace, *extra, *flags,
                   "--values", str(values), timeout_s=HELM_TIMEOUT_S)  # fmt: skip

    api = await make_api_client(str(control_plane.kubeconfig))
    try:
        deploy("install", 2)
        assert kube.request("GET", f"/api/v1/namespaces/{namespace}/configmaps/{name}")[0] == 404
        store = BreakerStore(api, namespace, name)  # the leader writes it, as on a trip
        tripped = StoredBreaker(
            open=True,
            trips=1,
            tripped_at="2026-11-22T10:00:00+00:00",
            window=(WindowEntry(node="gpu-1", at="2026-11-22T09:59:00+00:00"),),
        )
        await store.save(tripped)
        deploy("upgrade", 3, "--force")
        status, deployment = kube.request(
            "GET",
            f"/apis/apps/v1/namespaces/{namespace}/deployments/{release}-gpuhealth-controller",
        )
        assert status == 200 and deployment["spec"]["replicas"] == 3  # the upgrade did apply
        after = await store.load()
        assert after is not None and after.open and after.trips == 1
        assert after.window == tripped.window
    finally:
        await api.close()
        client.run("uninstall", release, "--namespace", namespace, "--no-hooks",
                   timeout_s=HELM_TIMEOUT_S)  # fmt: skip
