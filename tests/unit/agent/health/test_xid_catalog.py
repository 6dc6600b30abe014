"""The XID catalog data and the verdict rules of DESIGN.md "Health model"."""

from __future__ import annotations

import re

import pytest

from gpuhealth.agent.health.xid_catalog import catalog, classify, lookup

LABEL = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


def test_every_code_of_the_ampere_catalog_is_there() -> None:
    cat = catalog()
    assert set(cat) == set(range(1, 173))
    for info in cat.values():
        assert info.name and info.description and info.category and info.action
        assert info.severity in {"healthy", "degraded", "unhealthy"}


@pytest.mark.parametrize(
    ("xid", "severity", "action"),
    [
        (13, "healthy", "RESTART_APP"),
        (31, "healthy", "RESTART_APP"),
        (43, "healthy", "IGNORE"),
        (45, "healthy", "IGNORE"),
        (63, "healthy", "IGNORE"),
        (94, "healthy", "RESTART_APP"),
        (48, "unhealthy", "RESET_GPU"),
        (62, "unhealthy", "RESET_GPU"),
        (64, "unhealthy", "RESET_GPU"),
        (74, "unhealthy", "RESET_GPU"),
        (79, "unhealthy", "RESTART_BM"),
        (95, "unhealthy", "RESET_GPU"),
        (109, "unhealthy", "RESET_GPU"),
        (119, "unhealthy", "RESET_GPU"),
        (120, "unhealthy", "RESET_GPU"),
        (140, "unhealthy", "RESET_GPU"),
        (143, "unhealthy", "RESET_GPU"),
        (145, "unhealthy", "RESET_GPU"),
        (151, "unhealthy", "RESTART_VM"),
        (54, "unhealthy", "CHECK_MECHANICALS"),
        (78, "degraded", "UPDATE_SWFW"),
        (2, "degraded", "CONTACT_SUPPORT"),
        (154, "degraded", "FOLLOW_MESSAGE"),
        (500, "degraded", "CONTACT_SUPPORT"),
    ],
)
def test_verdicts(xid: int, severity: str, action: str) -> None:
    v = classify(xid)
    assert (v.severity, v.action) == (severity, action)
    assert v.code == f"xid-{xid}" and LABEL.match(v.code)
    assert v.reason == ("XidError" if lookup(xid) else "UnknownXid")


def test_catalog_actions_map_to_severities() -> None:
    for info in catalog().values():
        if info.category == "unused":
            assert info.severity == "degraded"
        elif info.catalog_action in ("IGNORE", "RESTART_APP"):
            assert info.severity == "healthy", info
        elif info.catalog_action in ("RESET_GPU", "RESTART_BM", "RESTART_VM", "CONTACT_SUPPORT"):
            assert info.severity == "unhealthy", info
        elif info.catalog_action is None:
            assert info.note, info  # gpuhealth's own choice is explained


def test_application_faults_are_flagged_for_escalation() -> None:
    assert all(classify(x).application for x in (13, 31, 43, 45))
    assert not classify(79).application and not classify(63).application


@pytest.mark.parametrize(
    ("message", "severity", "action"),
    [
        (
            "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
            "unhealthy",
            "RESTART_BM",
        ),
        (
            "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
            "unhealthy",
            "RESET_GPU",
        ),
        (
            "GPU recovery action changed from 0x0 (None) to 0x3 (Drain and Reset)",
            "unhealthy",
            "RESET_GPU",
        ),
        ("GPU recovery action changed from 0x0 (None) to 0x4 (Drain P2P)", "degraded", "DRAIN_P2P"),
        (
            "GPU recovery action changed from 0x2 (Node Reboot Required) to 0x0 (None)",
            "healthy",
            "IGNORE",
        ),
        ("something else entirely", "degraded", "FOLLOW_MESSAGE"),
    ],
)
def test_xid_154_follows_its_message(message: str, severity: str, action: str) -> None:
    v = classify(154, message)
    assert (v.severity, v.action) == (severity, action)


def test_h100_applicability() -> None:
    assert "H100" in catalog()[79].applies
    assert catalog()[1].applies == ()
