"""A phase's deadlines and when to look again (pure)."""

from __future__ import annotations

from datetime import datetime, timedelta


def seconds_until(at: datetime | None, now: datetime) -> float | None:
    return None if at is None else max(0.0, (at - now).total_seconds())


def earliest(*values: float | None) -> float | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def deadline(start: datetime | None, seconds: float, now: datetime) -> datetime:
    return (start or now) + timedelta(seconds=seconds)
