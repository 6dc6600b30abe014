"""External tools the integration tests need: a clear skip on a developer's machine, a
failure under ``CI=true`` (CI must never skip an integration test for a missing tool)."""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def missing(message: str) -> NoReturn:
    if in_ci():
        pytest.fail(f"CI=true and {message}", pytrace=False)
    pytest.skip(message)


def require(*names: str, hint: str) -> str:
    """The path of the first of ``names`` on PATH, or skip/fail naming ``hint``."""
    for name in names:
        path = shutil.which(name)
        if path is not None:
            return path
    missing(f"{names[0]} is not installed ({hint})")
