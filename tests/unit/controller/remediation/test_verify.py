"""verify(): every spec field is checked against what the node's agent reports (pure).

A hand-made GPURemediation (anyone who may create them) must not order more, or other,
than the controller would: each forged field below fails ``SpecMismatch``."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import msgspec
import pytest

from gpuhealth.controller.remediation.fault import episode_name, expected_spec, failed_gpus, verify
from gpuhealth.controller.remediation.model import Episode, Spec, initial_status
from gpuhealth.controller.remediation.settings import RemediationSettings, ResetSettings
from tests.fakes.remediation_world import T0, fault_condition, node_facts
from tests.support.remediation import settings

NODE = node_facts(unhealthy={3: fault_condition("xid-48", "RESET_GPU")})
CFG = settings()


def honest() -> Spec:
    spec = expected_spec(
        "node-a", "boot-1", failed_gpus(NODE), detected_at=T0, history=(), settings=CFG
    )
    assert spec is not None
    return spec


def episode(spec: Spec) -> Episode:
    return Episode(
        name=episode_name("node-a", spec.fault.fingerprint),
        uid="u",
        spec=spec,
        status=initial_status(spec.fault.detected_at),
        created=T0 + timedelta(seconds=1),
    )


def gpu(**changes: object) -> Callable[[Spec], Spec]:
    def edit(s: Spec) -> Spec:
        g = msgspec.structs.replace(s.fault.gpus[0], **changes)
        return msgspec.structs.replace(s, fault=msgspec.structs.replace(s.fault, gpus=[g]))

    return edit


def fault(**changes: object) -> Callable[[Spec], Spec]:
    return lambda s: msgspec.structs.replace(s, fault=msgspec.structs.replace(s.fault, **changes))


def spec(**changes: object) -> Callable[[Spec], Spec]:
    return lambda s: msgspec.structs.replace(s, **changes)


def both(*edits: Callable[[Spec], Spec]) -> Callable[[Spec], Spec]:
    def edit(s: Spec) -> Spec:
        for e in edits:
            s = e(s)
        return s

    return edit


@pytest.mark.parametrize(
    ("name", "edit", "cfg", "want"),
    [
        ("honest", spec(), CFG, None),
        ("a broader scope is allowed", spec(scope="node"), CFG, None),
        (
            "a reboot claimed by the GPU's action",
            both(gpu(action="RESTART_BM"), spec(action="reboot")),
            CFG,
            "SpecMismatch",
        ),
        ("another GPU index", gpu(index=5), CFG, "SpecMismatch"),
        ("another reason", gpu(reason="Forged"), CFG, "SpecMismatch"),
        (
            "detectedAt moved back a month",
            fault(detected_at=T0 - timedelta(days=30)),
            CFG,
            "SpecMismatch",
        ),
        ("another recommended action", fault(recommended_action="RESTART_BM"), CFG, "SpecMismatch"),
        ("an escalation reason", fault(escalation_reason="RepeatedFaults"), CFG, "SpecMismatch"),
        (
            "a narrower scope than the controller's",
            spec(scope="gpu"),
            msgspec.structs.replace(CFG, reset_gpu=ResetSettings(enabled=True, scope="node")),
            "SpecMismatch",
        ),
        ("another code", gpu(code="xid-79"), CFG, "FaultCleared"),
        ("another boot", fault(boot_id="boot-0"), CFG, "BootChanged"),
    ],
)
def test_every_spec_field_is_checked(
    name: str, edit: Callable[[Spec], Spec], cfg: RemediationSettings, want: str | None
) -> None:
    problem = verify(episode(edit(honest())), NODE, (), cfg)
    assert (problem[0] if problem else None) == want, problem
