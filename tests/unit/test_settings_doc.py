"""Every setting of the agent and controller configs is documented: docs/settings.md is what
hack/settings_doc.py generates from the Settings structs (each leaf field, its default and its
docstring), and docs/operations.md points to it."""

from __future__ import annotations

import contextlib
import io
import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "settings.md"


def _generated() -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        module = runpy.run_path(str(ROOT / "hack" / "settings_doc.py"))
        assert module["main"]() == 0
    return out.getvalue()


def test_every_setting_has_a_row() -> None:
    text = _generated()
    for path in ("`kmsg.use_inotify`", "`remediation.drain.gang.max_pods`", "`http.auth.reads`"):
        assert f"| {path} |" in text
    assert text.count("\n| `") > 200


def test_every_setting_says_what_it_does() -> None:
    undocumented = [
        line.split("|")[1].strip()
        for line in _generated().splitlines()
        if line.startswith("| `") and line.rstrip().endswith("|  |")
    ]
    assert undocumented == [], "settings without a docstring in their Settings struct"


def test_docs_settings_md_is_up_to_date() -> None:
    assert DOC.read_text() == _generated(), (
        "docs/settings.md is stale: run `python hack/settings_doc.py > docs/settings.md`"
    )


def test_operations_md_points_to_the_reference() -> None:
    assert "docs/settings.md" in (ROOT / "docs" / "operations.md").read_text()
