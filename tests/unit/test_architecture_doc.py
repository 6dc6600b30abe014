"""docs/architecture.md names every product module, and every module path it names exists.

(Its path of one XID is checked against the walk in the code: ``tests/unit/test_xid_path.py``.)

The module tables are the map a newcomer reads to find the room for a change: a module missing
from its section's table, or a path left behind by a rename, makes the map lie. How a name in
the document is read:

- A backticked token ending in ``.py`` is a module path. It is tried against the repository
  root, against the section's package (``wiring.py`` in "Agent" is ``agent/wiring.py``), and
  against every backticked directory (``health/``, ``tests/support/``) named earlier in the same
  table row, itself under the root or the section's package (the ``sources/kmsg/`` row lists
  ``readers.py``).
- A product module counts as documented only when a token of a module-table row of its own
  section resolves to it: ``agent/…`` in "Agent", ``controller/…`` in "Controller", ``protocol/…``
  and ``common/…`` in "Protocol and common".
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "gpuhealth"
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("agent", "controller", "protocol", "common")
# The section whose module table documents each package.
SECTION_OF = {
    "agent": "Agent",
    "controller": "Controller",
    "protocol": "Protocol and common",
    "common": "Protocol and common",
}
SECTION_ROOTS = {"Agent": ("agent",), "Controller": ("controller",)}
# Sections that name modules of any package by their path inside it (`sources/base.py`).
ANY_PACKAGE_SECTIONS = {"Where a change goes"}
TOKEN = re.compile(r"`([^`\s]+)`")


def _product_modules() -> set[str]:
    """Every product module: ``agent/wiring.py``, … (not packages' ``__init__``, not _pb stubs)."""
    found: set[str] = set()
    for package in PACKAGES:
        for path in (SRC / package).rglob("*.py"):
            rel = path.relative_to(SRC)
            if path.name == "__init__.py" or "_pb" in rel.parts:
                continue
            found.add(rel.as_posix())
    return found


def _sections(text: str) -> list[tuple[str, str]]:
    """``## Heading`` -> body, in order (the text before the first heading is dropped)."""
    parts = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    return [(parts[i].strip(), parts[i + 1]) for i in range(1, len(parts) - 1, 2)]


def _bases(section: str) -> list[Path]:
    packages = PACKAGES if section in ANY_PACKAGE_SECTIONS else SECTION_ROOTS.get(section, ())
    return [ROOT, SRC] + [SRC / pkg for pkg in packages]


def _resolve(token: str, dirs: list[str], bases: list[Path]) -> Path | None:
    """The existing file a module token names, or None."""
    for base in bases:
        for prefix in [*reversed(dirs), ""]:  # the row's directory before the package itself
            candidate = base / prefix / token
            if candidate.is_file():
                return candidate
    return None


def _module_tokens() -> list[tuple[str, bool, str, Path | None]]:
    """(section, in a table row, token, the file it names or None) for every ``*.py`` token."""
    out: list[tuple[str, bool, str, Path | None]] = []
    for section, body in _sections(DOC.read_text()):
        bases = _bases(section)
        for line in body.splitlines():
            in_table = line.lstrip().startswith("|")
            dirs: list[str] = []
            for token in TOKEN.findall(line):
                if token.endswith("/"):
                    dirs.append(token)
                    continue
                if not token.endswith(".py") or "*" in token:
                    continue
                out.append((section, in_table, token, _resolve(token, dirs, bases)))
    return out


def test_the_module_tables_are_read() -> None:
    # The test itself can fail: the parser finds modules in the tables it checks.
    tokens = _module_tokens()
    resolved = {p for _, table, _, p in tokens if table and p is not None}
    assert SRC / "agent" / "sources" / "kmsg" / "readers.py" in resolved
    assert SRC / "controller" / "kube" / "lease.py" in resolved
    assert _resolve("nope_missing.py", ["sources/kmsg/"], _bases("Agent")) is None


def test_every_module_path_named_exists() -> None:
    stale = sorted(
        f"{section}: `{token}`" for section, _, token, path in _module_tokens() if path is None
    )
    assert not stale, f"docs/architecture.md names modules that do not exist: {stale}"


def test_every_product_module_is_in_its_sections_table() -> None:
    named: set[str] = set()
    for section, in_table, _, path in _module_tokens():
        if not in_table or path is None or SRC not in path.resolve().parents:
            continue
        rel = path.resolve().relative_to(SRC).as_posix()
        if SECTION_OF.get(rel.split("/", 1)[0]) == section:
            named.add(rel)
    missing = sorted(_product_modules() - named)
    assert not missing, (
        "product modules missing from docs/architecture.md's module tables "
        f"(a row of the right section with what each is): {missing}"
    )
