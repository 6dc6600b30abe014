"""The controller configuration: file plus flags, and every bad file a ConfigError."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuhealth.common.errors import ConfigError
from gpuhealth.controller.settings import load_config


def test_config_file_and_flags(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("breaker:\n  max_fraction: 0.2\npolicy:\n  noexecute_codes: [xid-79]\n")
    cfg = load_config(str(f), {"dry_run": True, "listen": None})
    assert cfg.breaker.max_fraction == 0.2 and cfg.breaker.window_s == 600.0
    assert cfg.policy.noexecute_codes == ("xid-79",)
    assert cfg.dry_run and cfg.listen == "0.0.0.0:8080"


@pytest.mark.parametrize(
    "text",
    [
        "nope: 1\n",
        "breaker:\n  max_fraction: 2\n",
        "reconciler:\n  workers: 0\n",
        "leader:\n  lease_duration_s: 5\n  renew_deadline_s: 10\n",
        "- a list\n",
        "prefix: a/b\n",
    ],
)
def test_bad_config_is_a_config_error(tmp_path: Path, text: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError):
        load_config(str(f))


def test_missing_config_file() -> None:
    with pytest.raises(ConfigError, match=r"nope\.yaml"):
        load_config("/nonexistent/nope.yaml")


@pytest.mark.parametrize(
    "prefix",
    [
        # Kubernetes' own keys live here (kubernetes.io/hostname, node.kubernetes.io/
        # unschedulable ...): the reconciler and the uninstall cleanup remove what is under
        # the prefix, so such a prefix would strip cordons and well-known labels fleet-wide.
        "kubernetes.io",
        "node.kubernetes.io",
        "k8s.io",
        "resource.k8s.io",
        "KUBERNETES.IO",
        # not a DNS subdomain: no key can be under it, or it is read differently elsewhere
        "Gpuhealth.io",
        "gpuhealth.io ",
        "-gpuhealth.io",
        "gpuhealth..io",
        "a" * 254,
    ],
)
def test_a_prefix_that_is_kubernetes_own_or_no_dns_subdomain_is_refused(
    tmp_path: Path, prefix: str
) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(f"prefix: {prefix!r}\n")
    with pytest.raises(ConfigError, match="prefix"):
        load_config(str(f))


@pytest.mark.parametrize(
    "prefix", ["gpuhealth.io", "gpu.example.com", "gpuhealth", "k8s.example", "a" * 48 + ".io"]
)
def test_a_prefix_of_our_own_is_accepted(tmp_path: Path, prefix: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(f"prefix: {prefix}\n")
    assert load_config(str(f)).prefix == prefix


def test_a_prefix_too_long_for_the_override_labels_is_refused(tmp_path: Path) -> None:
    """``node-restriction.kubernetes.io/<prefix>-remediation``: a label's name part is at most
    63 characters, so a 52-character prefix (a valid DNS subdomain) cannot form it."""
    f = tmp_path / "c.yaml"
    f.write_text(f"prefix: {'a' * 49 + '.io'}\n")
    with pytest.raises(ConfigError, match=r"prefix: at most 51 characters \(got 52\)"):
        load_config(str(f))


@pytest.mark.parametrize(
    ("text", "field"),
    [
        # a pool label that is no label key
        ("fleet: {pool_labels: ['Not A Label']}\n", "fleet.pool_labels"),
        ("fleet: {pool_labels: ['karpenter.sh/']}\n", "fleet.pool_labels"),
        # pool "" (nodes in no pool) has only the fleet-wide budget
        ("breaker: {pools: {'': {max_fraction: 0.5}}}\n", "breaker.pools"),
        ("breaker: {pools: {gpu-a: {max_fraction: 1.5}}}\n", "breaker.pools"),
        # replacement pools: a label value each, once, a known method
        ("remediation: {replace: {enabled: true, pools: [{pool: ''}]}}\n", "remediation.replace"),
        ("remediation: {replace: {pools: [{pool: a}, {pool: a}]}}\n", "remediation.replace.pools"),
        ("remediation: {replace: {pools: [{pool: a, method: terminate}]}}\n", "method"),
        ("remediation: {managed_repair: {rules: [{owner: x}]}}\n", "remediation.managed_repair"),
        ("policy: {cordon: always}\n", "policy.cordon"),
        # shards: each owned through its own Lease
        ("shards: {count: 3}\nleader: {enabled: false}\n", "shards.count"),
        ("shards: {count: 65}\n", "shards.count"),
        ("shards: {count: 0}\n", "shards.count"),
    ],
)
def test_bad_pool_replacement_and_repair_settings_name_their_field(
    tmp_path: Path, text: str, field: str
) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config(str(f))


def test_the_pool_replacement_and_repair_defaults(tmp_path: Path) -> None:
    cfg = load_config(None)
    assert cfg.fleet.pool_labels[:4] == (
        "karpenter.sh/nodepool",
        "eks.amazonaws.com/nodegroup",
        "cloud.google.com/gke-nodepool",
        "kubernetes.azure.com/agentpool",
    )
    assert cfg.breaker.per_pool and cfg.breaker.pools == {}
    assert not cfg.remediation.replace.enabled and cfg.remediation.replace.method_for("a") is None
    assert cfg.remediation.managed_repair.enabled
    assert (cfg.policy.cordon, cfg.policy.disruption_guard) == ("never", True)
    f = tmp_path / "c.yaml"
    f.write_text(
        "remediation: {replace: {enabled: true, pools: [{pool: a}, {pool: b, method: node}]}}\n"
    )
    replace = load_config(str(f)).remediation.replace
    assert (replace.method_for("a"), replace.method_for("b"), replace.method_for("c")) == (
        "nodeclaim",
        "node",
        None,
    )
