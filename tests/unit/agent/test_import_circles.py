"""No import circles in the agent: between its modules, nor between its packages.

The imports are read from the source (AST), every import outside a function counts, the
typing-only ones under ``if TYPE_CHECKING:`` included: a circle of those still means a type
lives in the wrong room (``nvml_device`` and ``nvml_fabric`` once imported each other that
way). A package's ``__init__`` importing its own modules is not a circle.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

SRC = Path(__file__).resolve().parents[3] / "src"
AGENT = "gpuhealth.agent"


def _name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in (SRC / "gpuhealth").rglob("*.py") if "_pb" not in p.parts}


def _module(dotted: str) -> str | None:
    """The product module an imported name lives in (``a.b.C`` -> ``a.b``), or None."""
    while dotted and dotted not in MODULES:
        dotted = dotted.rpartition(".")[0]
    return dotted or None


def _top_level_imports(tree: ast.AST) -> Iterable[str]:
    """Names imported outside any function (class bodies and ``if`` blocks included)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield from (f"{node.module}.{a.name}" for a in node.names)
        else:
            yield from _top_level_imports(node)


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in MODULES.items():
        if not name.startswith(AGENT):
            continue
        for imported in _top_level_imports(ast.parse(path.read_text(), str(path))):
            target = _module(imported)
            if target is None or not target.startswith(AGENT) or target == name:
                continue
            if not target.startswith(f"{name}."):  # a package's __init__ and its own modules
                graph[name].add(target)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component: list[str] = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _packages(graph: dict[str, set[str]], depth: int) -> dict[str, set[str]]:
    """The graph with every module folded into its package ``depth`` names deep."""

    def fold(name: str) -> str:
        return ".".join(name.split(".")[:depth])

    folded: dict[str, set[str]] = defaultdict(set)
    for a, targets in graph.items():
        for b in targets:
            fa, fb = fold(a), fold(b)
            if fa != fb and not fb.startswith(f"{fa}.") and not fa.startswith(f"{fb}."):
                folded[fa].add(fb)
    return folded


def test_the_walk_sees_the_agents_imports() -> None:
    graph = _graph()
    assert "gpuhealth.agent.sources.kmsg.readers" in graph["gpuhealth.agent.sources.kmsg.source"]
    assert _circles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert _packages({"x.p.m": {"x.q.n"}, "x.q.n": {"x.p.k"}}, 2) == {
        "x.p": {"x.q"},
        "x.q": {"x.p"},
    }


def test_no_module_of_the_agent_is_in_an_import_circle() -> None:
    assert _circles(_graph()) == []


def test_no_package_of_the_agent_is_in_an_import_circle() -> None:
    graph = _graph()
    deepest = max(name.count(".") for name in graph) + 1
    for depth in range(3, deepest + 1):  # gpuhealth.agent.X, then .X.Y, ...
        assert _circles(_packages(graph, depth)) == [], f"packages {depth} names deep"
