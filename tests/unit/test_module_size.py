"""No product module over 400 lines (one module per concept; most stay under 300)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agent", "controller", "common", "protocol")
LIMIT = 400


def test_no_product_module_is_over_the_limit() -> None:
    sizes = {
        str(p.relative_to(ROOT)): len(p.read_text().splitlines())
        for pkg in PACKAGES
        for p in (ROOT / pkg).rglob("*.py")
        if "_pb" not in p.parts
    }
    assert len(sizes) > 100, "the product packages were not found"
    assert {m: n for m, n in sizes.items() if n > LIMIT} == {}
