"""``gpuhealth-controller incident``: its arguments (the API server is in
tests/integration/test_incident_lifecycle.py, the command as a real process)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpuhealth.controller.incident_cli import EXIT_USAGE, UsageError, main, parse_until

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "until"),
    [
        ("90s", NOW + timedelta(seconds=90)),
        ("30m", NOW + timedelta(minutes=30)),
        ("2h", NOW + timedelta(hours=2)),
        ("1d", NOW + timedelta(days=1)),
        ("2026-11-26T14:00:00Z", NOW + timedelta(hours=2)),
        ("2026-11-26T15:00:00+01:00", NOW + timedelta(hours=2)),
        ("2026-11-26T14:00:00", NOW + timedelta(hours=2)),
    ],
)
def test_until(text: str, until: datetime) -> None:
    assert parse_until(text, NOW) == until


@pytest.mark.parametrize("text", ["soon", "2h30m", "-1h", "2026-11-26T11:00:00Z", "0s"])
def test_a_bad_or_past_until_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError):
        parse_until(text, NOW)


@pytest.mark.parametrize(
    "argv",
    [
        ["ack"],
        ["ack", "domain-0123456789ab"],
        ["ack", "domain-0123456789ab", "--reason", "  "],
        ["silence", "domain-0123456789ab", "--reason", "x"],
        ["resolve", "domain-0123456789ab", "--reason", "x", "--until", "1h"],
        ["silence", "domain-0123456789ab", "--reason", "x", "--until", "yesterday"],
    ],
)
def test_usage_errors_exit_2_before_asking_anyone(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--kubeconfig", "/nonexistent"]) == EXIT_USAGE
    assert "gpuhealth-controller incident:" in capsys.readouterr().err


def test_an_unreadable_kubeconfig_exits_2() -> None:
    assert main(["list", "--kubeconfig", "/nonexistent/kubeconfig"]) == EXIT_USAGE
