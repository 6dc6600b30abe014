"""The rule "only ``controller/kube`` imports kubernetes_asyncio": the rest of the product talks
to the API server through that package, so its types and errors never leak past it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("agent", "controller", "common", "protocol")
SRC = ROOT / "src" / "gpuhealth"
ALLOWED = SRC / "controller" / "kube"
LIBRARY = "kubernetes_asyncio"


def imported_modules(source: str) -> set[str]:
    """Every module an ``import`` or ``from ... import`` names, at any depth of the file."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def product_modules() -> list[Path]:
    return sorted(p for top in PRODUCT for p in (SRC / top).rglob("*.py") if "_pb" not in p.parts)


def test_the_product_is_walked() -> None:
    paths = product_modules()
    assert len(paths) > 100
    assert any(ALLOWED in p.parents for p in paths)


def test_only_controller_kube_imports_kubernetes_asyncio() -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for p in product_modules()
        if ALLOWED not in p.parents
        and any(
            m == LIBRARY or m.startswith(LIBRARY + ".")
            for m in imported_modules(p.read_text(encoding="utf-8"))
        )
    ]
    assert offenders == [], f"only controller/kube may import {LIBRARY}: {offenders}"


@pytest.mark.parametrize(
    ("source", "caught"),
    [
        ("import kubernetes_asyncio\n", True),
        ("from kubernetes_asyncio import client\n", True),
        ("from kubernetes_asyncio.client import ApiClient\n", True),
        ("def f():\n    import kubernetes_asyncio.config as c\n", True),
        ("import kubernetes_asyncio_extra\n", False),
        ("from . import kubernetes_asyncio\n", False),
        ("import aiohttp\n", False),
    ],
)
def test_the_walk_sees_every_form_of_import(source: str, caught: bool) -> None:
    found = imported_modules(source)
    assert any(m == LIBRARY or m.startswith(LIBRARY + ".") for m in found) is caught
