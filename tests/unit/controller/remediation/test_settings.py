"""The remediation section loads with the common loader: bounds, rules between fields,
errors naming file, line and field; off by default."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuhealth.common.config import load_settings
from gpuhealth.common.errors import ConfigError
from gpuhealth.controller.remediation.settings import RemediationSettings


def load(tmp_path: Path, text: str) -> RemediationSettings:
    path = tmp_path / "remediation.yaml"
    path.write_text(text)
    return load_settings(RemediationSettings, str(path))


def test_defaults_are_off_and_conservative() -> None:
    cfg = RemediationSettings()
    assert not cfg.enabled
    assert not (cfg.reset_gpu.enabled or cfg.reboot.enabled or cfg.escalate.enabled)
    assert cfg.reboot.approval_required
    assert cfg.safety.max_concurrent == 1 and cfg.safety.max_fraction <= 0.1
    assert cfg.drain.on_timeout == "escalate"


def test_a_full_file_loads(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        """
enabled: true
reset_gpu: {enabled: true, scope: node}
drain:
  rules:
    - {namespaces: [batch-*], mode: wait, wait_s: 600, force: true}
    - {namespaces: [critical], mode: never}
  on_timeout: force
validation:
  soak_s: 120
  pod: {namespace: gpu-checks, spec: {containers: [{name: t, image: cuda}]}}
""",
    )
    assert cfg.reset_gpu.scope == "node" and cfg.drain.rules[1].mode == "never"
    assert cfg.validation.pod is not None and cfg.validation.pod.namespace == "gpu-checks"


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("safety:\n  max_fraction: 2\n", "remediation.yaml:2: $.safety.max_fraction"),
        ("reset_gpu:\n  max_attempts: 0\n", "$.reset_gpu.max_attempts"),
        ("enabeld: true\n", "$.enabeld"),
        ("drain:\n  rules:\n    - {namespaces: []}\n", "$.drain.rules[0].namespaces"),
        ("drain:\n  retry_s: 100\n  timeout_s: 50\n", "$.drain.retry_s"),
        (
            "drain:\n  timeout_s: 60\n  rules: [{namespaces: [a], mode: wait, wait_s: 90}]\n",
            "$.drain.rules",
        ),
        ("validation:\n  soak_s: 3000\n  timeout_s: 3000\n", "$.validation.timeout_s"),
        ("validation:\n  pod: {namespace: x, spec: {}}\n", "$.validation.pod.spec"),
        (
            "validation:\n  pod: {namespace: Not_A_Name, spec: {containers: [{}]}}\n",
            "$.validation.pod.namespace",
        ),
        ("reboot:\n  order_timeout_s: 100\n  timeout_s: 10\n", "$.reboot.order_timeout_s"),
        ("action_map: {RESET_GPU: nuke}\n", "$.action_map"),
        ("drain:\n  gang: {kinds: [job, job]}\n", "$.drain.gang.kinds"),
    ],
)
def test_bad_settings_name_the_field(tmp_path: Path, text: str, where: str) -> None:
    with pytest.raises(ConfigError, match=__import__("re").escape(where)):
        load(tmp_path, text)
