"""The Helm chart lints and renders (defaults, and every option on) into what DESIGN asks for;
the rendered configs load with the agent's and controller's own loaders. The API-server side
(server-side dry run, RBAC reviews) is in test_helm_apiserver.py."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from gpuhealth.agent.cli import config_from_args as agent_config_from_args
from gpuhealth.controller.cleanup_cli import parser as cleanup_parser
from gpuhealth.controller.cli import parser as controller_parser
from gpuhealth.controller.http.access import SHARD_REPORTS_RESOURCE
from gpuhealth.controller.names import API_GROUP
from gpuhealth.controller.settings import load_config as load_controller_config
from tests.integration.tooling import missing

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpuhealth"
RULES = ROOT / "deploy" / "prometheus" / "rules.yaml"
KUBE_VERSION = "1.36.3"
HELM_TIMEOUT_S = 60

RBAC_GROUP = "rbac.authorization.k8s.io"
ALL_OPTIONS: dict[str, Any] = {
    "keyPrefix": "gpuhealth.example.com",
    "imagePullSecrets": [{"name": "regcred"}],
    "commonLabels": {"team": "ml-infra"},
    "agent": {
        "config": {"tick_interval_s": 2.0},
        "expectedGpus": 8,
        "runtimeClassName": "nvidia",
        "tolerateAllTaints": True,
        "kmsg": {"privileged": False},
        "dcgmExporter": {"counters": {"create": True}},
        "extraTolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu"}],
        "extraArgs": ["--source=nvml"],
        "extraEnv": [{"name": "GPUHEALTH_LOG_LEVEL", "value": "debug"}],
        "podAnnotations": {"example.com/a": "b"},
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]}
                    ]
                }
            }
        },
    },
    "controller": {
        "dryRun": True,
        "config": {"breaker": {"max_fraction": 0.2}},
        "tls": {"enabled": True, "secretName": "gpuhealth-tls"},
        "extenderClientCA": "scheduler-client-ca",
        "idle": {"annotatePods": True},
        "podAntiAffinity": "hard",
        "priorityClassName": "system-cluster-critical",
        "service": {"annotations": {"example.com/svc": "x"}},
        "rbac": {
            "operators": [
                {"kind": "Group", "name": "sre", "apiGroup": "rbac.authorization.k8s.io"}
            ],
            "viewers": [{"kind": "User", "name": "dana", "apiGroup": "rbac.authorization.k8s.io"}],
            "aggregateToView": True,
            "oncall": [
                {"kind": "Group", "name": "oncall", "apiGroup": "rbac.authorization.k8s.io"}
            ],
        },
    },
    "serviceMonitor": {"enabled": True, "additionalLabels": {"release": "prom"}},
    "podMonitor": {"enabled": True, "additionalLabels": {"release": "prom"}},
    "prometheusRule": {
        "enabled": True,
        "runbookBaseURL": "https://runbooks.example.com/gpuhealth/",
        "additionalLabels": {"release": "prom"},
    },
    "grafanaDashboards": {"enabled": True, "annotations": {"grafana_folder": "GPU"}},
    "networkPolicy": {
        "enabled": True,
        "apiServer": {"cidrs": ["10.0.0.1/32"]},
        "prometheus": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
        },
        "extenderFrom": [{"ipBlock": {"cidr": "192.168.0.0/24"}}],
    },
}


# ---------------------------------------------------------------- helm


@pytest.fixture(scope="module")
def helm(kube_assets: Path) -> str:
    path = kube_assets / "helm"
    if not os.access(path, os.X_OK):
        found = shutil.which("helm")
        if found is None:
            missing(f"helm not found in {kube_assets} (hack/kube-binaries.sh builds it)")
        return found
    return str(path)


def _run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [helm, *args], capture_output=True, text=True, timeout=HELM_TIMEOUT_S, check=False
    )


def render(
    helm: str,
    tmp_path: Path,
    values: dict[str, Any],
    release: str = "gpuhealth",
    ns: str = "gpuhealth",
) -> list[dict[str, Any]]:
    values_file = tmp_path / f"values-{release}.yaml"
    values_file.write_text(yaml.safe_dump(values))
    result = _run_helm(
        helm,
        "template",
        release,
        str(CHART),
        "--namespace",
        ns,
        "--kube-version",
        KUBE_VERSION,
        "--api-versions",
        "monitoring.coreos.com/v1",
        "-f",
        str(values_file),
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in by_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} objects"
    return found[0]


@pytest.mark.parametrize(
    "values",
    [{}, ALL_OPTIONS, {"shards": {"count": 3}, "controller": {"replicas": 4}}],
    ids=["defaults", "all-options", "shards"],
)
def test_helm_lint(helm: str, tmp_path: Path, values: dict[str, Any]) -> None:
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    result = _run_helm(
        helm, "lint", "--strict", str(CHART), "-f", str(values_file), "--kube-version", KUBE_VERSION
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def _template_fails(helm: str, tmp_path: Path, values: dict[str, Any]) -> str:
    """stderr of a ``helm template`` that must fail."""
    values_file = tmp_path / "refused.yaml"
    values_file.write_text(yaml.safe_dump(values))
    result = _run_helm(
        helm, "template", "x", str(CHART), "-f", str(values_file), "--kube-version", KUBE_VERSION
    )
    assert result.returncode != 0, result.stdout[:2000]
    return result.stderr


def _pem(data: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(base64.b64decode(data))


def test_tls_is_on_by_default_with_a_generated_certificate(helm: str, tmp_path: Path) -> None:
    """Offline (``helm template`` cannot look anything up) the chart generates a CA and a
    certificate for the controller Service's DNS name; the controller serves it, the agents
    dial that name and trust the CA, from a ConfigMap that holds nothing else."""
    docs = render(helm, tmp_path, {})
    secret = one(docs, "Secret", "gpuhealth-controller-tls")
    assert secret["type"] == "kubernetes.io/tls"
    ca, cert = _pem(secret["data"]["ca.crt"]), _pem(secret["data"]["tls.crt"])
    key = serialization.load_pem_private_key(base64.b64decode(secret["data"]["tls.key"]), None)
    cert.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert key.public_key() == cert.public_key()
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "gpuhealth-controller.gpuhealth.svc" in names.get_values_for_type(x509.DNSName)
    # An operator's kubectl port-forward to the leader: https://localhost:8080 verifies too.
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    assert names.get_values_for_type(x509.IPAddress) == []  # an address is no identity
    ca_map = one(docs, "ConfigMap", "gpuhealth-controller-ca")
    assert ca_map["data"] == {"ca.crt": base64.b64decode(secret["data"]["ca.crt"]).decode()}

    deploy = one(docs, "Deployment", "gpuhealth-controller")["spec"]["template"]
    (controller,) = deploy["spec"]["containers"]
    assert "--tls-cert-file=/etc/gpuhealth/tls/tls.crt" in controller["args"]
    assert "--tls-key-file=/etc/gpuhealth/tls/tls.key" in controller["args"]
    assert controller["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    volumes = {v["name"]: v for v in deploy["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "gpuhealth-controller-tls"

    ds = one(docs, "DaemonSet", "gpuhealth-agent")["spec"]["template"]
    (agent,) = ds["spec"]["containers"]
    assert (
        "--controller-url=wss://gpuhealth-controller.gpuhealth.svc:8080/v1/stream"
        in (agent["args"])
    )
    assert "--controller-ca-file=/etc/gpuhealth/controller-ca/ca.crt" in agent["args"]
    agent_volumes = {v["name"]: v for v in ds["spec"]["volumes"]}
    assert agent_volumes["controller-ca"]["configMap"]["name"] == "gpuhealth-controller-ca"
    assert not [v for v in ds["spec"]["volumes"] if "secret" in v], "agents mount no Secret"
    # A new certificate restarts both sides; an unchanged one (upgrades) restarts nothing.
    checksum = deploy["metadata"]["annotations"]["checksum/tls"]
    assert ds["metadata"]["annotations"]["checksum/tls"] == checksum


def test_plaintext_is_explicit_and_refuses_remediation(helm: str, tmp_path: Path) -> None:
    plaintext = {"controller": {"tls": {"enabled": False}}}
    docs = render(helm, tmp_path, plaintext)
    (agent,) = one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert (
        "--controller-url=ws://gpuhealth-controller.gpuhealth.svc:8080/v1/stream" in (agent["args"])
    )
    assert not [a for a in agent["args"] if a.startswith("--controller-ca-file")]
    assert by_kind(docs, "Secret") == [] and by_kind(docs, "Certificate") == []
    err = _template_fails(helm, tmp_path, {**plaintext, "remediation": {"enabled": True}})
    assert "remediation.enabled needs controller.tls.enabled" in err
    # With TLS (the default) the loop renders.
    render(helm, tmp_path, {"remediation": {"enabled": True}})


def test_cert_manager_issues_the_certificate_when_asked(helm: str, tmp_path: Path) -> None:
    cm = {"enabled": True, "issuerRef": {"name": "ca-issuer", "kind": "ClusterIssuer"}}
    docs = render(helm, tmp_path, {"controller": {"tls": {"certManager": cm}}})
    cert = one(docs, "Certificate", "gpuhealth-controller")
    assert cert["apiVersion"] == "cert-manager.io/v1"
    assert cert["spec"]["secretName"] == "gpuhealth-controller-tls"
    assert "gpuhealth-controller.gpuhealth.svc" in cert["spec"]["dnsNames"]
    assert cert["spec"]["issuerRef"] == {
        "name": "ca-issuer",
        "kind": "ClusterIssuer",
        "group": "cert-manager.io",
    }
    assert by_kind(docs, "Secret") == []  # cert-manager writes it
    ds = one(docs, "DaemonSet")["spec"]["template"]
    volumes = {v["name"]: v for v in ds["spec"]["volumes"]}
    assert volumes["controller-ca"][
        "configMap"
    ] == {  # the CA alone, which the controller publishes
        "name": "gpuhealth-controller-ca",
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }
    assert "checksum/tls" not in ds["metadata"].get("annotations", {})  # it reloads itself
    err = _template_fails(
        helm, tmp_path, {"controller": {"tls": {"certManager": {"enabled": True}}}}
    )
    assert "controller.tls.certManager.issuerRef.name is required" in err
    both = {"secretName": "mine", "certManager": cm}
    err = _template_fails(helm, tmp_path, {"controller": {"tls": both}})
    assert "not both" in err


TLS_MODES: dict[str, dict[str, Any]] = {
    "generated by the chart": {},
    "generated by the controller": {"controller": {"tls": {"generatedBy": "controller"}}},
    "cert-manager": {
        "controller": {
            "tls": {"certManager": {"enabled": True, "issuerRef": {"name": "ca-issuer"}}}
        }
    },
    "own Secret": {"controller": {"tls": {"secretName": "mine"}}},
    "a trust bundle": {
        "controller": {"tls": {"secretName": "mine", "caConfigMap": "cluster-trust"}}
    },
}


def key_material_reaching_agents(docs: list[dict[str, Any]]) -> list[str]:
    """What in the agent's pod could hold a private key: any Secret it mounts (directly or
    projected: the kubelet of a GPU node may read every Secret its pods mount, an ``items``
    filter notwithstanding), and any rendered ConfigMap it mounts that holds a PEM key."""
    found = []
    pod = one(docs, "DaemonSet", "gpuhealth-agent")["spec"]["template"]["spec"]
    maps = {d["metadata"]["name"]: d for d in by_kind(docs, "ConfigMap")}
    for v in pod["volumes"]:
        if "secret" in v:
            found.append(f"volume {v['name']}: Secret {v['secret']['secretName']}")
        for source in (v.get("projected") or {}).get("sources", []):
            if "secret" in source:
                found.append(f"volume {v['name']}: projected Secret {source['secret']['name']}")
        cm = maps.get((v.get("configMap") or {}).get("name", ""))
        if cm is not None and "PRIVATE KEY" in yaml.safe_dump(cm.get("data") or {}):
            found.append(f"volume {v['name']}: ConfigMap {cm['metadata']['name']} holds a key")
    for ctr in pod["containers"]:
        for env in ctr.get("env") or []:
            if "secretKeyRef" in (env.get("valueFrom") or {}):
                found.append(f"env {env['name']}: a Secret's key")
        found += [
            f"envFrom {e['secretRef']['name']}"
            for e in ctr.get("envFrom") or []
            if "secretRef" in e
        ]
    return found


@pytest.mark.parametrize("mode", sorted(TLS_MODES))
def test_agents_get_the_ca_alone_in_every_tls_mode(helm: str, tmp_path: Path, mode: str) -> None:
    """In every TLS mode the agents trust the CA from a ConfigMap that holds only it: no
    agent ever mounts the Secret with the controller's key (before, the cert-manager and
    own-Secret modes mounted it, ``items: [ca.crt]``), so no GPU node can take the key and
    impersonate the controller that sends reset and reboot orders."""
    docs = render(helm, tmp_path, TLS_MODES[mode])
    assert key_material_reaching_agents(docs) == []
    pod = one(docs, "DaemonSet", "gpuhealth-agent")["spec"]["template"]["spec"]
    ca = {v["name"]: v for v in pod["volumes"]}["controller-ca"]["configMap"]
    want = "cluster-trust" if mode == "a trust bundle" else "gpuhealth-controller-ca"
    assert ca == {"name": want, "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    config = yaml.safe_load(
        one(docs, "ConfigMap", "gpuhealth-controller")["data"]["controller.yaml"]
    )
    publishes = mode not in ("generated by the chart", "a trust bundle")
    assert ("ca_configmap" in config.get("tls", {})) is publishes  # the controller publishes it
    rendered_ca = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"] == want]
    assert bool(rendered_ca) is (mode == "generated by the chart")
    role = one(docs, "Role", "gpuhealth-controller")["rules"]
    ca_rule = {
        "apiGroups": [""],
        "resources": ["configmaps"],
        "resourceNames": [want],
        "verbs": ["get", "patch"],
    }
    assert (ca_rule in role) is publishes


def test_the_agents_pod_with_a_secret_holding_a_key_is_caught(helm: str, tmp_path: Path) -> None:
    """The check above can fail: the old own-Secret rendering (the Secret's ca.crt item) and
    a key in a ConfigMap are both reported."""
    docs = render(helm, tmp_path, TLS_MODES["own Secret"])
    pod = one(docs, "DaemonSet", "gpuhealth-agent")["spec"]["template"]["spec"]
    pod["volumes"].append(
        {
            "name": "old",
            "secret": {"secretName": "mine", "items": [{"key": "ca.crt", "path": "ca.crt"}]},
        }
    )
    pem = "-----BEGIN PRIVATE KEY-----\nx\n-----END PRIVATE KEY-----"
    leaky = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "leaky"},
        "data": {"k": pem},
    }
    docs.append(leaky)
    pod["volumes"].append({"name": "leak", "configMap": {"name": "leaky"}})
    assert key_material_reaching_agents(docs) == [
        "volume old: Secret mine",
        "volume leak: ConfigMap leaky holds a key",
    ]


def test_the_controller_generated_mode_renders_nothing_random(helm: str, tmp_path: Path) -> None:
    """generatedBy: controller survives ``helm template`` (Argo CD, Flux): two renders are the
    same, nothing holds a key or a checksum that would restart pods; the controller keeps its
    pair in a Secret no render contains (its name in its config, its RBAC by name), writes it
    to a memory emptyDir, and publishes the CA."""
    values = TLS_MODES["generated by the controller"]
    first = render(helm, tmp_path, values)
    assert render(helm, tmp_path, values) == first
    assert by_kind(first, "Secret") == []
    for kind in ("Deployment", "DaemonSet"):
        assert "checksum/tls" not in (
            one(first, kind)["spec"]["template"]["metadata"].get("annotations") or {}
        )
    config = yaml.safe_load(
        one(first, "ConfigMap", "gpuhealth-controller")["data"]["controller.yaml"]
    )
    assert config["tls"] == {
        "secret": "gpuhealth-controller-certificate",
        "ca_configmap": "gpuhealth-controller-ca",
        "names": [
            "gpuhealth-controller.gpuhealth.svc",
            "gpuhealth-controller",
            "gpuhealth-controller.gpuhealth",
            "gpuhealth-controller.gpuhealth.svc.cluster.local",
            "localhost",
        ],
    }
    pod = one(first, "Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tls"] == {"name": "tls", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}
    (controller,) = pod["containers"]
    mount = {m["name"]: m for m in controller["volumeMounts"]}["tls"]
    assert mount["readOnly"] is False
    role = one(first, "Role", "gpuhealth-controller")["rules"]
    assert {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]} in role
    assert {
        "apiGroups": [""],
        "resources": ["secrets"],
        "resourceNames": ["gpuhealth-controller-certificate"],
        "verbs": ["get", "update"],
    } in role
    err = _template_fails(helm, tmp_path, {"controller": {"tls": {"generatedBy": "helm"}}})
    assert "generatedBy must be chart or controller" in err


def test_defaults_render_the_agent_as_designed(helm: str, tmp_path: Path) -> None:
    docs = render(helm, tmp_path, {})
    ds = one(docs, "DaemonSet", "gpuhealth-agent")
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["automountServiceAccountToken"] is False
    tolerations = pod["tolerations"]
    assert {"key": "gpuhealth.io/unhealthy", "operator": "Exists"} in tolerations
    assert {"key": "gpuhealth.io/degraded", "operator": "Exists"} in tolerations
    assert {"key": "gpuhealth.io/nvlink-domain", "operator": "Exists"} in tolerations
    assert {"key": "gpuhealth.io/remediation", "operator": "Exists"} in tolerations
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations
    assert "runtimeClassName" not in pod

    volumes = {v["name"]: v for v in pod["volumes"]}
    token = volumes["token"]["projected"]["sources"][0]["serviceAccountToken"]
    assert token == {"path": "token", "audience": "gpuhealth", "expirationSeconds": 3600}
    assert volumes["kmsg"]["hostPath"] == {"path": "/dev/kmsg", "type": "CharDevice"}
    assert volumes["pod-resources"]["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    assert volumes["state"]["hostPath"]["path"] == "/var/lib/gpuhealth"
    assert volumes["sysfs"]["hostPath"] == {"path": "/sys", "type": "Directory"}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["kmsg"]["readOnly"] is True
    assert mounts["pod-resources"]["readOnly"] is True
    assert mounts["token"]["readOnly"] is True
    assert mounts["sysfs"] == {"name": "sysfs", "mountPath": "/host/sys", "readOnly": True}
    assert "--rdma-sysfs-root=/host/sys" in container["args"]

    args = container["args"]
    assert "--node-name=$(NODE_NAME)" in args
    assert "--token-file=/var/run/secrets/gpuhealth/token" in args
    assert "--controller-url=wss://gpuhealth-controller.gpuhealth.svc:8080/v1/stream" in args
    assert "--kmsg-path=/dev/kmsg" in args
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert container["resources"] == {
        "requests": {"cpu": "50m", "memory": "64Mi"},
        "limits": {"cpu": "200m", "memory": "128Mi"},
    }
    assert container["securityContext"]["readOnlyRootFilesystem"] is True

    sa = one(docs, "ServiceAccount", "gpuhealth-agent")
    assert sa["automountServiceAccountToken"] is False
    for binding in by_kind(docs, "RoleBinding") + by_kind(docs, "ClusterRoleBinding"):
        assert all(s["name"] != "gpuhealth-agent" for s in binding["subjects"]), binding


def test_unprivileged_agent_keeps_only_cap_syslog(helm: str, tmp_path: Path) -> None:
    docs = render(helm, tmp_path, {"agent": {"kmsg": {"privileged": False}}})
    (container,) = one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    sc = container["securityContext"]
    assert sc["privileged"] is False
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYSLOG"]}

    docs = render(helm, tmp_path, {"agent": {"kmsg": {"enabled": False}}})
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert "--kmsg-path=none" in container["args"]
    assert "kmsg" not in {v["name"] for v in pod["volumes"]}


def test_rails_off_mount_no_sysfs(helm: str, tmp_path: Path) -> None:
    docs = render(helm, tmp_path, {"agent": {"rdma": {"enabled": False}}})
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "--rdma-sysfs-root=none" in container["args"]
    assert "sysfs" not in {v["name"] for v in pod["volumes"]}
    assert "sysfs" not in {m["name"] for m in container["volumeMounts"]}
    args = [a.replace("$(NODE_NAME)", "gpu-node-1") for a in container["args"]]
    assert agent_config_from_args(args)[0].rdma.enabled is False


@pytest.mark.parametrize("enabled", [True, False])
def test_process_attribution_shares_the_host_pid_namespace_only_when_on(
    helm: str, tmp_path: Path, enabled: bool
) -> None:
    """NVML reports host PIDs: mapping them to containers needs hostPID and the kubelet's
    container-log names (agent/usage.py host_resolver reads /proc and /var/log/containers)."""
    docs = render(helm, tmp_path, {"agent": {"processAttribution": {"enabled": enabled}}})
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert pod.get("hostPID", False) is enabled
    assert ("container-logs" in mounts) is enabled
    if enabled:
        assert mounts["container-logs"] == {
            "name": "container-logs",
            "mountPath": "/var/log/containers",
            "readOnly": True,
        }


def test_defaults_render_the_controller_as_designed(helm: str, tmp_path: Path) -> None:
    docs = render(helm, tmp_path, {})
    deploy = one(docs, "Deployment", "gpuhealth-controller")
    assert deploy["spec"]["replicas"] == 2
    pod = deploy["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    # Both replicas Ready (rollouts and helm --wait complete); traffic finds the leader
    # through the endpoint it publishes for the selector-less Service.
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz/replica"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    env = {
        e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        for e in container["env"]
    }
    assert env["POD_IP"] == "status.podIP" and env["POD_NAME"] == "metadata.name"
    assert "preferredDuringSchedulingIgnoredDuringExecution" in pod["affinity"]["podAntiAffinity"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    service = one(docs, "Service", "gpuhealth-controller")
    assert service["spec"]["ports"][0]["port"] == 8080
    assert service["spec"]["ports"][0]["name"] == "http"  # the leader's slice port name
    assert "selector" not in service["spec"]
    controller_cfg = yaml.safe_load(
        one(docs, "ConfigMap", "gpuhealth-controller")["data"]["controller.yaml"]
    )
    assert controller_cfg["leader"]["service"] == "gpuhealth-controller"
    # The Lease belongs to the release (helm uninstall removes it); the breaker's ConfigMap is
    # the controller's (helm upgrade --force replaced a rendered one with its empty rendering)
    assert one(docs, "Lease", "gpuhealth-controller").get("spec") is None
    assert [d for d in docs if d["metadata"]["name"] == "gpuhealth-breaker"] == []
    metrics = one(docs, "Service", "gpuhealth-controller-metrics")
    assert metrics["spec"]["publishNotReadyAddresses"] is True

    for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule", "NetworkPolicy"):
        assert by_kind(docs, kind) == [], f"{kind} must be opt-in"
    # The incidents: their CRD (kept on uninstall) and who may act on them.
    crds = {d["metadata"]["name"]: d for d in by_kind(docs, "CustomResourceDefinition")}
    assert set(crds) == {"gpuremediations.gpuhealth.io", "gpuincidents.gpuhealth.io"}
    incidents = crds["gpuincidents.gpuhealth.io"]
    assert incidents["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    policy = one(docs, "ValidatingAdmissionPolicy", "gpuhealth-controller-incidents")
    assert policy["spec"]["failurePolicy"] == "Fail"
    controller_user = "system:serviceaccount:gpuhealth:gpuhealth-controller"
    assert controller_user in policy["spec"]["variables"][0]["expression"]
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["gpuincidents"]  # not its status: the controller's (RBAC)
    binding = one(docs, "ValidatingAdmissionPolicyBinding", "gpuhealth-controller-incidents")
    assert binding["spec"]["validationActions"] == ["Deny"]
    without = render(helm, tmp_path, {"incidents": {"installCRD": False}})
    assert [d["metadata"]["name"] for d in by_kind(without, "CustomResourceDefinition")] == [
        "gpuremediations.gpuhealth.io"
    ]


@pytest.mark.parametrize("values", [{}, ALL_OPTIONS], ids=["defaults", "all-options"])
def test_rendered_configs_load_with_the_real_loaders(
    helm: str, tmp_path: Path, values: dict[str, Any]
) -> None:
    """The ConfigMaps the chart writes are accepted by the agent's and controller's own
    config loaders (both refuse unknown keys), and carry this release's identities."""
    docs = render(helm, tmp_path, values, ns="gpu-system")
    controller_map = one(docs, "ConfigMap", "gpuhealth-controller")
    controller_file = tmp_path / "controller.yaml"
    controller_file.write_text(controller_map["data"]["controller.yaml"])
    cfg = load_controller_config(str(controller_file))
    assert cfg.prefix == values.get("keyPrefix", "gpuhealth.io")
    assert (cfg.leader.namespace, cfg.leader.lease_name) == ("gpu-system", "gpuhealth-controller")
    assert cfg.breaker.configmap == "gpuhealth-breaker"
    assert cfg.breaker.max_fraction == values.get("controller", {}).get("config", {}).get(
        "breaker", {}
    ).get("max_fraction", 0.1)
    assert cfg.idle.annotate == bool(values.get("controller", {}).get("idle"))
    assert cfg.stream.audience == "gpuhealth"
    assert (cfg.stream.agent_namespace, cfg.stream.agent_service_account) == (
        "gpu-system",
        "gpuhealth-agent",
    )
    (controller,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    try:
        controller_parser().parse_args(controller["args"])
    except SystemExit as exc:
        raise AssertionError(f"controller refused {controller['args']}") from exc

    agent_maps = [
        d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"] == "gpuhealth-agent"
    ]
    if not values.get("agent", {}).get("config"):
        assert agent_maps == []
        return
    agent_file = tmp_path / "agent.yaml"
    agent_file.write_text(agent_maps[0]["data"]["agent.yaml"])
    (container,) = one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    args = [
        a.replace("$(NODE_NAME)", "gpu-node-1").replace(
            "/etc/gpuhealth/config/agent.yaml", str(agent_file)
        )
        for a in container["args"]
    ]
    agent_cfg, _ = agent_config_from_args(args)
    assert agent_cfg.node_name == "gpu-node-1"
    assert agent_cfg.tick_interval_s == 2.0
    assert agent_cfg.nvml.expected_gpus == 8
    assert (agent_cfg.rdma.enabled, agent_cfg.rdma.sysfs_root) == (True, "/host/sys")


def test_controller_rbac_is_exactly_what_it_uses(helm: str, tmp_path: Path) -> None:
    docs = render(helm, tmp_path, {})
    rules = {
        (group, resource): sorted(rule["verbs"])
        for rule in one(docs, "ClusterRole", "gpuhealth-controller")["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert rules == {
        ("", "nodes"): sorted(["get", "list", "watch", "patch"]),
        ("", "nodes/status"): ["patch"],
        ("", "events"): ["create"],
        ("authentication.k8s.io", "tokenreviews"): ["create"],
        ("authorization.k8s.io", "subjectaccessreviews"): ["create"],
        ("", "pods"): ["get"],
        ("resource.k8s.io", "resourceslices"): ["list"],
        ("resource.k8s.io", "devicetaintrules"): sorted(["get", "list", "create", "delete"]),
        # Stored episodes keep their quarantine with the loop off: read, never written.
        ("gpuhealth.io", "gpuremediations"): sorted(["get", "list", "watch"]),
        # Incidents: watched everywhere; the leader creates them (empty spec), patches their
        # labels, writes their status, deletes closed ones; it never updates the object.
        ("gpuhealth.io", "gpuincidents"): sorted(
            ["get", "list", "watch", "create", "patch", "delete"]
        ),
        ("gpuhealth.io", "gpuincidents/status"): ["update"],
    }
    oncall = one(docs, "ClusterRole", "gpuhealth-controller-oncall")["rules"]
    assert oncall == [
        {
            "apiGroups": ["gpuhealth.io"],
            "resources": ["gpuincidents"],
            "verbs": ["get", "list", "watch", "patch", "update"],
        },
        {
            "apiGroups": ["gpuhealth.io"],
            "resources": ["gpuremediations"],
            "verbs": ["get", "list", "watch"],
        },
    ]
    names = {b["metadata"]["name"] for b in by_kind(docs, "ClusterRoleBinding")}
    assert "gpuhealth-controller-oncall" not in names  # subjects only when given
    bound = render(
        helm, tmp_path, {"controller": {"rbac": {"oncall": [{"kind": "Group", "name": "sre"}]}}}
    )
    binding = one(bound, "ClusterRoleBinding", "gpuhealth-controller-oncall")
    assert binding["roleRef"]["name"] == "gpuhealth-controller-oncall"
    assert binding["subjects"] == [{"kind": "Group", "name": "sre"}]
    not_hooks = [
        b
        for b in by_kind(docs, "RoleBinding")
        if "helm.sh/hook" not in (b["metadata"].get("annotations") or {})
    ]
    assert not_hooks == [one(docs, "RoleBinding", "gpuhealth-controller")]
    operator = one(docs, "Role", "gpuhealth-controller-operator")["rules"]
    assert operator == [
        {
            "apiGroups": ["gpuhealth.io"],
            "resources": ["circuitbreakers"],
            "verbs": ["get", "update"],
        },
        {"apiGroups": ["gpuhealth.io"], "resources": ["fleet"], "verbs": ["get"]},
    ]
    viewer = one(docs, "ClusterRole", "gpuhealth-controller-viewer")  # on-call readers
    assert viewer["rules"] == [
        {"apiGroups": ["gpuhealth.io"], "resources": ["fleet"], "verbs": ["get"]}
    ]
    assert "rbac.authorization.k8s.io/aggregate-to-view" not in viewer["metadata"]["labels"]
    role = one(docs, "Role", "gpuhealth-controller")
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["gpuhealth-controller"],
            "verbs": ["get", "update"],
        },
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["gpuhealth-breaker"],
            "verbs": ["get", "patch"],
        },
        {
            "apiGroups": [""],
            "resources": ["services"],
            "resourceNames": ["gpuhealth-controller"],
            "verbs": ["get"],
        },
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["create"]},
        {
            "apiGroups": ["discovery.k8s.io"],
            "resources": ["endpointslices"],
            "resourceNames": ["gpuhealth-controller-leader"],
            "verbs": ["get", "patch"],
        },
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
    ]


HOOK_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Job")


def _rules(obj: dict[str, Any]) -> dict[tuple[str, str, tuple[str, ...]], list[str]]:
    return {
        (group, resource, tuple(rule.get("resourceNames", ()))): sorted(rule["verbs"])
        for rule in obj["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }


def test_uninstall_runs_the_cleanup_hook_with_its_own_rbac(helm: str, tmp_path: Path) -> None:
    docs = render(helm, tmp_path, {})
    hooks = [d for d in docs if "helm.sh/hook" in (d["metadata"].get("annotations") or {})]
    assert sorted(d["kind"] for d in hooks) == sorted(HOOK_KINDS)
    for obj in hooks:
        ann = obj["metadata"]["annotations"]
        assert obj["metadata"]["name"] == "gpuhealth-cleanup"
        assert ann["helm.sh/hook"] == "pre-delete"
        assert ann["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    weight = {d["kind"]: int(d["metadata"]["annotations"]["helm.sh/hook-weight"]) for d in hooks}
    assert weight["Job"] > max(v for k, v in weight.items() if k != "Job")  # RBAC first

    job = one(docs, "Job", "gpuhealth-cleanup")
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "gpuhealth-cleanup"
    assert pod["restartPolicy"] == "Never" and pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    assert container["command"] == ["gpuhealth-controller", "cleanup"]
    args = cleanup_parser().parse_args(container["args"])
    assert (args.stop_deployment, args.keep_taints) == ("gpuhealth-controller", False)
    assert args.config == "/etc/gpuhealth/config/controller.yaml"
    (volume,) = pod["volumes"]
    assert volume["configMap"]["name"] == "gpuhealth-controller"  # the controller's own config
    # gpuhealth's own taints do not keep it off the nodes (it is there to remove them).
    assert {(t["key"], t["operator"]) for t in pod["tolerations"]} == {
        ("gpuhealth.io/unhealthy", "Exists"),
        ("gpuhealth.io/degraded", "Exists"),
        ("gpuhealth.io/nvlink-domain", "Exists"),
        ("gpuhealth.io/remediation", "Exists"),
    }
    # The pod is not one of the controller's (the hook waits for those to go).
    deploy = one(docs, "Deployment", "gpuhealth-controller")
    selector = deploy["spec"]["selector"]["matchLabels"].items()
    assert not selector <= job["spec"]["template"]["metadata"]["labels"].items()

    assert _rules(one(docs, "ClusterRole", "gpuhealth-cleanup")) == {
        ("", "nodes", ()): ["get", "list", "patch"],
        ("", "nodes/status", ()): ["patch"],
        ("resource.k8s.io", "devicetaintrules", ()): ["delete", "list"],
    }
    assert _rules(one(docs, "Role", "gpuhealth-cleanup")) == {
        ("apps", "deployments", ("gpuhealth-controller",)): ["get", "patch"],
        ("", "pods", ()): ["list"],
        ("coordination.k8s.io", "leases", ("gpuhealth-controller",)): ["get"],
        ("discovery.k8s.io", "endpointslices", ("gpuhealth-controller-leader",)): ["delete"],
        ("", "configmaps", ("gpuhealth-breaker",)): ["delete"],  # the controller's own
    }
    kept = render(helm, tmp_path, {"controller": {"tls": {"generatedBy": "controller"}}})
    own = ("gpuhealth-breaker", "gpuhealth-controller-ca")  # and the CA it published
    assert _rules(one(kept, "Role", "gpuhealth-cleanup"))[("", "configmaps", own)] == ["delete"]

    annotating = render(helm, tmp_path, {"controller": {"idle": {"annotatePods": True}}})
    rules = _rules(one(annotating, "ClusterRole", "gpuhealth-cleanup"))
    assert rules[("", "pods", ())] == ["list", "patch"]
    kept = render(helm, tmp_path, {"cleanup": {"keepTaints": True}})
    (container,) = one(kept, "Job")["spec"]["template"]["spec"]["containers"]
    assert cleanup_parser().parse_args(container["args"]).keep_taints is True
    # With a validation pod namespace, the hook deletes the loop's validation pods there.
    loop = {"remediation": {"enabled": True, "validationPodNamespace": "gpu-validation"}}
    role = one(render(helm, tmp_path, loop), "Role", "gpuhealth-cleanup-validation")
    assert role["metadata"]["namespace"] == "gpu-validation"
    assert _rules(role) == {("", "pods", ()): ["delete", "list"]}
    assert [
        d
        for d in render(helm, tmp_path, {"remediation": {"validationPodNamespace": "v"}})
        if d["metadata"]["name"] == "gpuhealth-cleanup-validation"
    ] == []
    off = render(helm, tmp_path, {"cleanup": {"enabled": False}})
    assert [d for d in off if d["metadata"]["name"] == "gpuhealth-cleanup"] == []


def test_kernel_log_may_be_a_file_read_without_privileges(helm: str, tmp_path: Path) -> None:
    values = {"agent": {"kmsg": {"hostPath": "/var/log/kern-copy", "hostPathType": "File",
                                 "privileged": False}}}  # fmt: skip
    pod = one(render(helm, tmp_path, values), "DaemonSet")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["kmsg"]["hostPath"] == {"path": "/var/log/kern-copy", "type": "File"}
    (container,) = pod["containers"]
    assert "--kmsg-path=/dev/kmsg" in container["args"]
    assert container["securityContext"]["privileged"] is False


def test_kernel_log_type_is_checked(helm: str, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"agent": {"kmsg": {"hostPathType": "Socket"}}}))
    result = _run_helm(
        helm, "template", "x", str(CHART), "--kube-version", KUBE_VERSION, "-f", str(values)
    )
    assert result.returncode != 0
    assert "hostPathType must be CharDevice or File" in result.stderr


def test_simulator_scenario_ships_in_the_agent_configmap(helm: str, tmp_path: Path) -> None:
    scenario = {"gpus": 2, "events": [{"at": 5, "gpu": 1, "xid": 79}]}
    values = {"agent": {"source": "sim", "simScenarioData": scenario}}
    docs = render(helm, tmp_path, values)
    cm = one(docs, "ConfigMap", "gpuhealth-agent")
    assert yaml.safe_load(cm["data"]["scenario.yaml"]) == scenario
    assert "agent.yaml" not in cm["data"]
    pod = one(docs, "DaemonSet")["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert "--sim-scenario=/etc/gpuhealth/config/scenario.yaml" in container["args"]
    assert {"name": "config", "mountPath": "/etc/gpuhealth/config", "readOnly": True} in container[
        "volumeMounts"
    ]
    assert "checksum/config" in pod["metadata"]["annotations"]


def test_all_options_render(helm: str, tmp_path: Path) -> None:
    docs = render(helm, tmp_path, ALL_OPTIONS)
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"
    assert {"key": "gpuhealth.example.com/unhealthy", "operator": "Exists"} in pod["tolerations"]
    assert {"key": "gpuhealth.example.com/degraded", "operator": "Exists"} in pod["tolerations"]
    (agent,) = pod["containers"]
    url = "wss://gpuhealth-controller.gpuhealth.svc:8080/v1/stream"
    assert f"--controller-url={url}" in agent["args"]
    assert "--controller-ca-file=/etc/gpuhealth/controller-ca/ca.crt" in agent["args"]
    assert "--expected-gpus=8" in agent["args"]
    (controller,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "--dry-run" in controller["args"]
    assert "--tls-cert-file=/etc/gpuhealth/tls/tls.crt" in controller["args"]
    assert controller["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    # Their own Secret: the controller mounts it and publishes its ca.crt alone; the agents
    # (and Prometheus) take the CA from that ConfigMap; nothing generated.
    volumes = {v["name"]: v for v in one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "gpuhealth-tls"
    assert {v["name"]: v for v in pod["volumes"]}["controller-ca"]["configMap"]["name"] == (
        "gpuhealth-controller-ca"
    )
    assert by_kind(docs, "Secret") == []
    assert one(docs, "ServiceMonitor")["spec"]["endpoints"][0]["tlsConfig"]["ca"] == {
        "configMap": {"name": "gpuhealth-controller-ca", "key": "ca.crt"}
    }
    # mutual TLS for the extender: the scheduler's client CA mounted, named in the config
    assert volumes["extender-client-ca"]["configMap"]["name"] == "scheduler-client-ca"
    config = yaml.safe_load(
        one(docs, "ConfigMap", "gpuhealth-controller")["data"]["controller.yaml"]
    )
    assert config["extender"]["client_ca_file"] == "/etc/gpuhealth/extender-client-ca/ca.crt"
    assert len(by_kind(docs, "NetworkPolicy")) == 2
    operators = one(docs, "RoleBinding", "gpuhealth-controller-operator")
    assert operators["roleRef"]["name"] == "gpuhealth-controller-operator"
    assert operators["subjects"][0]["name"] == "sre"
    viewers = one(docs, "RoleBinding", "gpuhealth-controller-viewer")
    assert viewers["subjects"][0]["name"] == "dana"
    assert viewers["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "gpuhealth-controller-viewer",
    }
    viewer = one(docs, "ClusterRole", "gpuhealth-controller-viewer")
    assert viewer["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    # reads are authorized: Prometheus sends its token
    endpoint = one(docs, "ServiceMonitor")["spec"]["endpoints"][0]
    assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    oncall = one(docs, "ClusterRoleBinding", "gpuhealth-controller-oncall")
    assert oncall["subjects"][0]["name"] == "oncall"
    assert one(docs, "ServiceMonitor")["metadata"]["labels"]["release"] == "prom"
    assert one(docs, "PodMonitor")["metadata"]["labels"]["release"] == "prom"


def test_dcgm_exporter_source_scrapes_the_node_and_ships_the_counters(
    helm: str, tmp_path: Path
) -> None:
    values = {
        "agent": {
            "source": "dcgm-exporter",
            "dcgmExporter": {"counters": {"create": True, "namespace": "gpu-operator"}},
        },
        "networkPolicy": {"enabled": True},
    }
    docs = render(helm, tmp_path, values)
    (container,) = one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert "--source=dcgm-exporter" in container["args"]
    assert "--dcgm-exporter-url=http://$(NODE_IP):9400/metrics" in container["args"]
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    cm = one(docs, "ConfigMap", "gpuhealth-dcgm-exporter-counters")
    assert cm["metadata"]["namespace"] == "gpu-operator"
    csv_text = (CHART / "files" / "dcgm-exporter" / "gpuhealth-counters.csv").read_text()
    assert cm["data"]["dcgm-metrics.csv"] == csv_text  # the GPU operator's key
    assert cm["data"]["metrics"] == csv_text  # dcgm-exporter -m namespace:name
    policy = one(docs, "NetworkPolicy", "gpuhealth-agent")
    assert {"ports": [{"protocol": "TCP", "port": 9400}]} in policy["spec"]["egress"]

    defaults = render(helm, tmp_path, {"networkPolicy": {"enabled": True}})
    (container,) = one(defaults, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert not any(a.startswith("--dcgm-exporter-url") for a in container["args"])
    assert "NODE_IP" not in {e["name"] for e in container["env"]}
    assert not [d for d in by_kind(defaults, "ConfigMap") if "dcgm" in d["metadata"]["name"]]
    egress = one(defaults, "NetworkPolicy", "gpuhealth-agent")["spec"]["egress"]
    assert all(9400 not in [p["port"] for p in rule.get("ports", [])] for rule in egress)


def test_agent_egress_rules_open_the_reboot_webhook_and_nothing_else(
    helm: str, tmp_path: Path
) -> None:
    webhook = {
        "to": [{"ipBlock": {"cidr": "10.0.0.5/32"}}],
        "ports": [{"protocol": "TCP", "port": 8443}],
    }
    docs = render(helm, tmp_path, {"networkPolicy": {"enabled": True, "agentEgress": [webhook]}})
    agent_egress = one(docs, "NetworkPolicy", "gpuhealth-agent")["spec"]["egress"]
    assert agent_egress[-1] == webhook
    controller_egress = one(docs, "NetworkPolicy", "gpuhealth-controller")["spec"]["egress"]
    assert webhook not in controller_egress

    defaults = render(helm, tmp_path, {"networkPolicy": {"enabled": True}})
    default_egress = one(defaults, "NetworkPolicy", "gpuhealth-agent")["spec"]["egress"]
    assert default_egress == agent_egress[:-1]


def test_dashboards_ship_as_configmaps(helm: str, tmp_path: Path) -> None:
    docs = render(helm, tmp_path, ALL_OPTIONS)
    maps = [d for d in by_kind(docs, "ConfigMap") if "-dashboard-" in d["metadata"]["name"]]
    shipped = {key: json.loads(text) for m in maps for key, text in m["data"].items()}
    expected = {p.name: json.loads(p.read_text()) for p in (ROOT / "dashboards").glob("*.json")}
    assert shipped == expected
    assert all(m["metadata"]["labels"]["grafana_dashboard"] == "1" for m in maps)


def test_prometheus_rule_is_the_plain_rule_file(helm: str, tmp_path: Path) -> None:
    docs = render(helm, tmp_path, {"prometheusRule": {"enabled": True}})
    rendered = one(docs, "PrometheusRule")["spec"]["groups"]
    assert rendered == yaml.safe_load(RULES.read_text())["groups"]

    docs = render(helm, tmp_path, ALL_OPTIONS)
    for group in one(docs, "PrometheusRule")["spec"]["groups"]:
        for rule in group["rules"]:
            url = rule["annotations"]["runbook_url"]
            assert url == f"https://runbooks.example.com/gpuhealth/{rule['alert']}.md"


def test_contradictory_remediation_values_are_refused(helm: str, tmp_path: Path) -> None:
    """remediation.reboot through the agent with no agent reboot executor would drain nodes
    that then cannot reboot: the chart refuses it; with an executor, or an external one, it
    renders."""
    loop = {"enabled": True, "reboot": True}
    err = _template_fails(helm, tmp_path, {"remediation": loop})
    assert "remediation.reboot needs a way to reboot" in err
    render(helm, tmp_path, {"remediation": {**loop, "agent": {"reboot": {"executor": "command"}}}})
    external = {"config": {"remediation": {"reboot": {"executor": "external"}}}}
    render(helm, tmp_path, {"remediation": loop, "controller": external})
    render(helm, tmp_path, {"remediation": {"enabled": True}})


def test_replacement_is_opt_in_per_pool_and_its_rbac_follows_the_methods(
    helm: str, tmp_path: Path
) -> None:
    """remediation.replacePools: the controller's remediation.replace, and only the delete
    the listed methods use: get+delete on karpenter.sh nodeclaims for a nodeclaim pool,
    delete on nodes for a node pool; neither without a pool (nor with the loop off)."""

    def rules(values: dict[str, Any]) -> dict[tuple[str, str], list[str]]:
        docs = render(helm, tmp_path, values)
        out: dict[tuple[str, str], list[str]] = {}
        for rule in one(docs, "ClusterRole", "gpuhealth-controller")["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    out.setdefault((group, resource), []).extend(rule["verbs"])
        return out

    def config(values: dict[str, Any]) -> Any:
        docs = render(helm, tmp_path, values)
        data = one(docs, "ConfigMap", "gpuhealth-controller")["data"]["controller.yaml"]
        path = tmp_path / "controller.yaml"
        path.write_text(data)
        return load_controller_config(str(path))

    loop = {"enabled": True, "escalate": True}
    plain = rules({"remediation": loop})
    assert ("karpenter.sh", "nodeclaims") not in plain and "delete" not in plain[("", "nodes")]
    assert not config({"remediation": loop}).remediation.replace.enabled
    pools = [{"pool": "a100"}, {"pool": "ng-h100", "method": "node"}]
    both = {"remediation": {**loop, "replacePools": pools}}
    got = rules(both)
    assert sorted(got[("karpenter.sh", "nodeclaims")]) == ["delete", "get"]
    assert "delete" in got[("", "nodes")]
    replace = config(both).remediation.replace
    assert replace.enabled
    assert [(p.pool, p.method) for p in replace.pools] == [
        ("a100", "nodeclaim"),
        ("ng-h100", "node"),
    ]
    karpenter_only = rules({"remediation": {**loop, "replacePools": [{"pool": "a100"}]}})
    assert "delete" not in karpenter_only[("", "nodes")]
    off = rules({"remediation": {"enabled": False, "replacePools": pools}})
    assert ("karpenter.sh", "nodeclaims") not in off and "delete" not in off[("", "nodes")]
    err = _template_fails(
        helm,
        tmp_path,
        {"remediation": {**loop, "replacePools": [{"pool": "x", "method": "terminate"}]}},
    )
    assert "method must be nodeclaim or node" in err


# ---------------------------------------------------------------- shards

SHARDED: dict[str, Any] = {"shards": {"count": 3}, "controller": {"replicas": 4}}
"""Past one process: three shards, a replica each and a spare."""


def _template_text(helm: str, tmp_path: Path, values: dict[str, Any]) -> str:
    """``helm template``'s output as it is, byte for byte."""
    values_file = tmp_path / "values-text.yaml"
    values_file.write_text(yaml.safe_dump(values))
    result = _run_helm(helm, "template", "gpuhealth", str(CHART), "--namespace", "gpu-system",
                       "--kube-version", KUBE_VERSION, "-f", str(values_file))  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize(
    "values",
    [TLS_MODES["generated by the controller"], ALL_OPTIONS],
    ids=["defaults", "all-options"],
)
def test_one_shard_renders_exactly_what_the_chart_rendered_without_shards(
    helm: str, tmp_path: Path, values: dict[str, Any]
) -> None:
    """shards.count=1 (the default) is today's release, byte for byte: no shard Service, no
    shards: section, no shard name in the RBAC, the agents dial the one Service. (The TLS mode
    that renders nothing random, so that two renders can be compared as text.)"""
    plain = _template_text(helm, tmp_path, values)
    one_shard = _template_text(helm, tmp_path, {**values, "shards": {"count": 1}})
    assert one_shard == plain
    assert "shard" not in plain


def test_three_shards_render_a_service_each_and_the_rbac_for_their_names(
    helm: str, tmp_path: Path
) -> None:
    docs = render(helm, tmp_path, SHARDED, ns="gpu-system")
    services = {s["metadata"]["name"]: s for s in by_kind(docs, "Service")}
    shard_services = [f"gpuhealth-controller-shard-{i}" for i in range(3)]
    assert sorted(services) == sorted(
        ["gpuhealth-controller", "gpuhealth-controller-metrics", *shard_services]
    )
    leader = services["gpuhealth-controller"]["spec"]
    for name in shard_services:
        spec = services[name]["spec"]
        # Selector-less like the leader's: the shard's owner publishes <name>-leader.
        assert "selector" not in spec and "selector" not in leader
        assert spec["ports"] == leader["ports"] and spec["type"] == leader["type"]

    # The shards' Leases belong to the release, as the one Lease does: uninstall removes them.
    assert sorted(lease["metadata"]["name"] for lease in by_kind(docs, "Lease")) == [
        "gpuhealth-controller",
        *(f"gpuhealth-controller-shard-{i}" for i in range(3)),
    ]
    role = one(docs, "Role", "gpuhealth-controller")["rules"]
    named = {
        (rule["resources"][0], tuple(rule["verbs"])): rule["resourceNames"]
        for rule in role
        if "resourceNames" in rule
    }
    assert named[("leases", ("get", "update"))] == [
        "gpuhealth-controller",
        *(f"gpuhealth-controller-shard-{i}" for i in range(3)),
    ]
    assert named[("configmaps", ("get", "patch"))] == [
        "gpuhealth-breaker",
        *(f"gpuhealth-breaker-shard-{i}" for i in range(3)),
        "gpuhealth-shards",
    ]
    assert named[("services", ("get",))] == ["gpuhealth-controller", *shard_services]
    assert named[("endpointslices", ("get", "patch"))] == [
        "gpuhealth-controller-leader",
        *(f"{s}-leader" for s in shard_services),
    ]
    # create stays unnamed (as for the one Lease), and nothing else grows.
    unnamed = [r for r in role if "resourceNames" not in r]
    plain_role = one(render(helm, tmp_path, {}), "Role", "gpuhealth-controller")["rules"]
    assert unnamed == [r for r in plain_role if "resourceNames" not in r]
    cluster = one(docs, "ClusterRole", "gpuhealth-controller")["rules"]
    nodes = [r for r in cluster if r["resources"] == ["nodes"]]
    assert nodes == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]}
    ]


def test_three_shards_configure_the_controller_and_point_each_agent_at_its_shard(
    helm: str, tmp_path: Path
) -> None:
    """The rendered configs load with the real loaders: the controller's shards: section, the
    agent's shard count and a URL whose {shard} names one of the rendered Services."""
    from gpuhealth.agent.stream.shard_route import ShardRoute
    from gpuhealth.protocol.shards import shard_of

    docs = render(helm, tmp_path, SHARDED, ns="gpu-system")
    controller_file = tmp_path / "controller.yaml"
    controller_file.write_text(
        one(docs, "ConfigMap", "gpuhealth-controller")["data"]["controller.yaml"]
    )
    cfg = load_controller_config(str(controller_file))
    assert (cfg.shards.count, cfg.shards.replicas, cfg.shards.takeover_after_s) == (3, 4, 30.0)
    # `--set shards.takeoverAfterSeconds=12.5` gives the chart a string: a number in the file.
    given = {**SHARDED, "shards": {"count": 3, "takeoverAfterSeconds": "12.5"}}
    config = one(render(helm, tmp_path, given), "ConfigMap", "gpuhealth-controller")
    assert yaml.safe_load(config["data"]["controller.yaml"])["shards"]["takeover_after_s"] == 12.5
    assert cfg.leader.service == "gpuhealth-controller"
    assert one(docs, "Deployment")["spec"]["replicas"] == 4
    # The other replicas are read over TLS, verified with the CA the agents trust, by the
    # controller's own ServiceAccount bound as a viewer.
    assert cfg.shards.peer_ca_file == "/etc/gpuhealth/peer-ca/ca.crt"
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    (peer_ca,) = [v for v in pod["volumes"] if v["name"] == "peer-ca"]
    assert peer_ca["configMap"]["name"] == "gpuhealth-controller-ca"
    mounts = {m["name"]: m["mountPath"] for c in pod["containers"] for m in c["volumeMounts"]}
    assert mounts["peer-ca"] == "/etc/gpuhealth/peer-ca"
    (peers,) = [b for b in by_kind(docs, "RoleBinding") if b["metadata"]["name"].endswith("-peers")]
    assert peers["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "gpuhealth-controller-viewer",
    }
    assert peers["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpuhealth-controller", "namespace": "gpu-system"}
    ]
    # A job's reports and attempts handed between owners (create shardreports): granted to
    # the controller's own ServiceAccount, and nothing else in that Role.
    handoffs = one(docs, "Role", "gpuhealth-controller-shard-handoffs")
    assert handoffs["rules"] == [
        {"apiGroups": [API_GROUP], "resources": [SHARD_REPORTS_RESOURCE], "verbs": ["create"]}
    ]
    binding = one(docs, "RoleBinding", "gpuhealth-controller-shard-handoffs")
    assert binding["roleRef"]["name"] == "gpuhealth-controller-shard-handoffs"
    assert binding["subjects"] == peers["subjects"]
    one_shard = render(helm, tmp_path, {**SHARDED, "shards": {"count": 1}}, ns="gpu-system")
    assert not [r for r in by_kind(one_shard, "Role") if "shard-handoffs" in r["metadata"]["name"]]

    (container,) = one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    args = [a.replace("$(NODE_NAME)", "gpu-node-1") for a in container["args"]]
    agent_cfg, _ = agent_config_from_args(args)
    assert agent_cfg.controller_shards == 3
    assert agent_cfg.controller_url == (
        "wss://gpuhealth-controller-shard-{shard}.gpu-system.svc:8080/v1/stream"
    )
    route = ShardRoute.for_node(agent_cfg.controller_url, 3, "gpu-node-1")
    host = route.url.removeprefix("wss://").split(":")[0]
    assert host == f"gpuhealth-controller-shard-{shard_of('gpu-node-1', 3)}.gpu-system.svc"
    assert host.split(".")[0] in {s["metadata"]["name"] for s in by_kind(docs, "Service")}


def _names(cert: x509.Certificate) -> list[str]:
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return san.get_values_for_type(x509.DNSName)


def test_the_certificate_names_every_shards_service_in_every_mode(
    helm: str, tmp_path: Path
) -> None:
    """The agents verify the host they dial: each shard's Service's name is in the
    certificate, whoever makes it."""
    hosts = [f"gpuhealth-controller-shard-{i}.gpuhealth.svc" for i in range(3)]
    docs = render(helm, tmp_path, SHARDED)
    secret = one(docs, "Secret", "gpuhealth-controller-tls")
    assert set(hosts) <= set(_names(_pem(secret["data"]["tls.crt"])))
    assert "gpuhealth-controller.gpuhealth.svc" in _names(_pem(secret["data"]["tls.crt"]))
    # Read back by the next upgrade only while it names these shards (README "TLS").
    assert secret["metadata"]["annotations"] == {"gpuhealth.io/tls-shards": "3"}
    kept = render(helm, tmp_path, {**SHARDED, **TLS_MODES["generated by the controller"]})
    config = yaml.safe_load(
        one(kept, "ConfigMap", "gpuhealth-controller")["data"]["controller.yaml"]
    )
    assert set(hosts) <= set(config["tls"]["names"])
    managed = render(helm, tmp_path, {**SHARDED, **TLS_MODES["cert-manager"]})
    assert set(hosts) <= set(one(managed, "Certificate")["spec"]["dnsNames"])


@pytest.mark.parametrize(
    ("values", "error"),
    [
        ({"shards": {"count": 0}}, "shards.count must be 1..64"),
        ({"shards": {"count": 65}}, "shards.count must be 1..64"),
        ({"shards": {"count": 3}, "controller": {"replicas": 0}}, "controller.replicas must be"),
        ({"shards": {"count": 3, "takeoverAfterSeconds": 0}}, "takeoverAfterSeconds must be"),
    ],
)
def test_shard_values_out_of_range_are_refused(
    helm: str, tmp_path: Path, values: dict[str, Any], error: str
) -> None:
    assert error in _template_fails(helm, tmp_path, values)
