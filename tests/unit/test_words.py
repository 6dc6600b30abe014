"""One word, one idea (docs/architecture.md "Words"), held cheaply.

- No two product classes share a name (two ``StateStore`` classes, one the agent's database
  and one a Protocol of the breaker's ConfigMap, once did).
- A class whose name has one of the checked words as a part (``Kube|Event|Sink``) is named in
  that word's entry of the glossary, so a new one is a decision about which idea it is; and
  every such class an entry names exists (the glossary does not outlive a rename).
- A module basename repeats across product packages only for a role listed here.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("agent", "controller", "common", "protocol")
CHECKED_WORDS = ("event", "report", "state", "source")

# Basenames several packages have, each for the same role in its own package.
SAME_ROLE = {
    "__init__.py": "a package",
    "app.py": "runs the process's parts as supervised tasks (agent, controller)",
    "assembly.py": "a subsystem's production parts, for the composition root",
    "auth.py": "who may call this package's endpoint",
    "cli.py": "a command line",
    "client.py": "the client of this package's remote API",
    "metrics.py": "this package's Prometheus metrics",
    "model.py": "this package's records and their book",
    "plan.py": "a pure plan of writes to the API server",
    "reboot.py": "executes the controller's reboot order (the node's executors; the simulator's)",
    "rules.py": "this package's pure rules as data",
    "server.py": "this package's network endpoint",
    "settings.py": "this package's settings section",
    "source.py": "a source package's ``Source`` (agent/sources/<source>/)",
    "view.py": "a read-only projection of the fleet",
}


def _modules() -> list[Path]:
    return [
        p
        for pkg in PACKAGES
        for p in sorted((ROOT / "src" / "gpuhealth" / pkg).rglob("*.py"))
        if "_pb" not in p.parts
    ]


def _classes() -> dict[str, list[str]]:
    found: dict[str, list[str]] = defaultdict(list)
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                found[node.name].append(path.relative_to(ROOT).as_posix())
    return found


def _parts(name: str) -> set[str]:
    """``JobKubeEvents`` -> {"job", "kube", "event"} (a plural counts as its word)."""
    words = re.findall(r"[A-Z]+(?![a-z])|[A-Z][a-z0-9]*|[a-z0-9]+", name)
    return {w.lower().removesuffix("s") if len(w) > 3 else w.lower() for w in words}


def _entry(word: str) -> str:
    text = DOC.read_text()
    words = re.search(r"^## Words$(.*?)^## ", text, re.S | re.M)
    assert words, 'docs/architecture.md has no "Words" section'
    entry = re.search(rf"^- \*\*{word}\*\* (.*?)(?=^- \*\*|\Z)", words.group(1), re.S | re.M)
    assert entry, f'the "Words" section has no entry for {word!r}'
    return entry.group(1)


def test_parts() -> None:
    assert _parts("JobKubeEvents") == {"job", "kube", "event"}
    assert _parts("GPURemediationStore") == {"gpu", "remediation", "store"}
    assert "state" not in _parts("StatusCondition")
    assert "state" in _parts("StateCounts")


def test_no_two_product_classes_share_a_name() -> None:
    shared = {name: paths for name, paths in _classes().items() if len(paths) > 1}
    assert not shared, f"product classes with the same name: {shared}"


@pytest.mark.parametrize("word", CHECKED_WORDS)
def test_a_checked_word_names_only_its_glossary_classes(word: str) -> None:
    classes = _classes()
    entry = _entry(word)
    named = {t for t in re.findall(r"`(\w+)`", entry) if t[:1].isupper() and word in _parts(t)}
    using = {name for name in classes if word in _parts(name)}
    assert using <= named, (
        f"classes with {word!r} in their name that its glossary entry does not name: "
        f"{sorted(using - named)} (pick the entry's meaning and name it there, or another word)"
    )
    assert named <= using, f"the {word!r} entry names classes that do not exist: {named - using}"


def test_module_basenames_repeat_only_for_the_same_role() -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in _modules():
        by_name[path.name].append(path.relative_to(ROOT).as_posix())
    repeated = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    unlisted = {name: paths for name, paths in repeated.items() if name not in SAME_ROLE}
    assert not unlisted, f"module names in several packages with no shared role: {unlisted}"
