"""The product's imports, followed from the code: layers, no circles, two halves.

Every import of every module of ``src/gpuhealth`` counts, at any depth of the file: typing-only
(``if TYPE_CHECKING:``) and lazy (inside a function) imports too, since each one says that a
module needs another. ``from a.b import c`` is an import of the module ``a.b.c`` when there is
one, else of ``a.b``; a package's ``__init__`` is not implied by importing a module inside it.

- (a) **Layers.** :data:`LAYERS` orders the product from the bottom up; a module imports only
  from its own layer or the layers below. A controller package is a layer of its own, so a
  package pair that imports each other is always an upward arrow.
- (b) **No circle** between modules (a strongly connected component of more than one).
- (c) **Two halves:** the agent and the controller never import each other; both build on
  ``gpuhealth.protocol`` and ``gpuhealth.common``.
- (d) **Settings:** the controller's aggregate configuration (``controller/settings.py``) is
  the composition's; a controller package reads its own section (and the informer's,
  ``kube/settings.py``, which every watch-fed cache hands to its informer).

A failure prints the offending arrows. The rules are shown to fail on small synthetic products
(:func:`check`).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"

C = "gpuhealth.controller"
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("common", ("gpuhealth", "gpuhealth.common.*")),
    ("protocol", ("gpuhealth.protocol.*",)),
    ("agent", ("gpuhealth.agent.*",)),
    # The controller, from the bottom up.
    ("names", (C, f"{C}.names")),  # what gpuhealth writes on Kubernetes objects: no imports
    ("aiohttp", (f"{C}.aiohttp_internals",)),  # aiohttp's private seams, each with a canary
    ("kube", (f"{C}.kube.*",)),  # the API server, nothing of gpuhealth's concepts
    ("utilities", (f"{C}.workqueue", f"{C}.loop_lag", f"{C}.heap", f"{C}.shutdown")),
    ("fleet", (f"{C}.fleet.*",)),  # what the agents say: node -> GPUs -> health
    ("breaker", (f"{C}.breaker.*",)),  # may a hard write happen now
    ("metrics", (f"{C}.metrics",)),  # the fleet, the node cache and the breaker as gauges
    ("taints", (f"{C}.taints.*",)),  # health -> taints, labels, condition, DRA rules: written
    ("leadership", (f"{C}.leadership.*",)),  # the Lease; what only the leader runs
    ("shards", (f"{C}.shards.*",)),  # past one process: shards owned through their Leases
    ("remediation", (f"{C}.remediation.*",)),  # a fault's episode, as leader work
    ("incidents", (f"{C}.incidents.*",)),  # job or GPU, NVLink domains: read episodes, taint
    ("idle", (f"{C}.idle.*",)),
    ("placement", (f"{C}.placement.*",)),
    ("stream", (f"{C}.stream.*",)),  # the agents' door: feeds a sink, knows nothing above
    ("http", (f"{C}.http.*",)),  # every route: the API reads fleet, breaker, episodes
    ("status_page", (f"{C}.status_page.*",)),  # renders what http/api.py renders
    ("cleanup", (f"{C}.cleanup.*",)),  # the uninstall: removes what everything above wrote
    (
        "composition",  # builds the parts from ControllerSettings; the commands
        (
            f"{C}.settings",
            f"{C}.compose",
            f"{C}.app",
            f"{C}.cli",
            f"{C}.status_cli",
            f"{C}.breaker_cli",
            f"{C}.incident_cli",
            f"{C}.cleanup_cli",
        ),
    ),
)
"""The product's layers, lowest first. ``x.*`` is the package ``x`` and every module under it;
a name without ``.*`` is that module alone; the longest match decides."""

HALVES = ("gpuhealth.agent", C)
AGGREGATE_SETTINGS = f"{C}.settings"
SETTINGS_MODULES = ("settings", "domain_settings")
"""Basenames of a package's settings section modules."""
SHARED_SECTIONS = (f"{C}.kube.settings", f"{C}.leadership.settings")
"""Sections any controller package may read: the informer's (``watch:``), and the Lease's
timings (``leader:``), which every holder of a Lease hands to its ``LeaderElector`` (the
shards' Leases are taken exactly as the one Lease)."""

# -- the import graph -----------------------------------------------------------------------


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(source: str, modules: set[str]) -> set[str]:
    """The product modules ``source`` imports (any depth, absolute imports)."""

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [
                f"{node.module}.{alias.name}"
                if f"{node.module}.{alias.name}" in modules
                else node.module
                for alias in node.names
            ]
        else:
            continue
        found.update(m for m in map(resolve, names) if m is not None)
    return found


def graph_of(sources: Mapping[str, str]) -> dict[str, set[str]]:
    """module -> the modules it imports, for a product given as module -> source."""
    modules = set(sources)
    return {m: imports_of(src, modules) - {m} for m, src in sources.items()}


def product_sources(src: Path = SRC) -> dict[str, str]:
    return {
        module_name(p, src): p.read_text(encoding="utf-8")
        for p in sorted((src / "gpuhealth").rglob("*.py"))
        if "_pb" not in p.parts
    }


# -- the rules ------------------------------------------------------------------------------


def layer_of(module: str, layers: Sequence[tuple[str, tuple[str, ...]]] = LAYERS) -> int | None:
    best: tuple[int, int] | None = None  # (match length, layer index)
    for index, (_, patterns) in enumerate(layers):
        for pattern in patterns:
            base = pattern.removesuffix(".*")
            inside = pattern.endswith(".*") and module.startswith(base + ".")
            matches = module == base or inside
            if matches and (best is None or len(base) > best[0]):
                best = (len(base), index)
    return None if best is None else best[1]


def unlayered(graph: Mapping[str, set[str]], layers: Sequence = LAYERS) -> list[str]:
    return sorted(m for m in graph if layer_of(m, layers) is None)


def upward(graph: Mapping[str, set[str]], layers: Sequence = LAYERS) -> list[str]:
    """Every arrow from a lower layer to a higher one, as ``a (layer) -> b (layer)``."""
    out = []
    for a, targets in sorted(graph.items()):
        la = layer_of(a, layers)
        for b in sorted(targets):
            lb = layer_of(b, layers)
            if la is not None and lb is not None and lb > la:
                out.append(f"{a} ({layers[la][0]}) -> {b} ({layers[lb][0]})")
    return out


def cycles(graph: Mapping[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[frozenset[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterable[str]]] = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(iter(children), None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def circle_arrows(graph: Mapping[str, set[str]], component: frozenset[str]) -> list[str]:
    return sorted(f"{a} -> {b}" for a in component for b in graph.get(a, ()) if b in component)


def across_halves(graph: Mapping[str, set[str]]) -> list[str]:
    def half(m: str) -> str | None:
        return next((h for h in HALVES if m == h or m.startswith(h + ".")), None)

    return sorted(
        f"{a} -> {b}"
        for a, targets in graph.items()
        for b in targets
        if half(a) is not None and half(b) is not None and half(a) != half(b)
    )


def _package(module: str) -> str:
    """The controller package a module is in (``gpuhealth.controller.fleet``), or the module."""
    parts = module.split(".")
    return ".".join(parts[:3]) if len(parts) > 3 else module


def settings_arrows(graph: Mapping[str, set[str]], layers: Sequence = LAYERS) -> list[str]:
    """Imports of the aggregate settings from outside the composition, and of another
    package's settings section, in the controller."""
    top = len(layers) - 1
    out = []
    for a, targets in sorted(graph.items()):
        if not a.startswith(C + "."):
            continue
        for b in sorted(targets):
            if b == AGGREGATE_SETTINGS and layer_of(a, layers) != top:
                out.append(f"{a} -> {b} (the aggregate: the composition's)")
            elif (
                b.rpartition(".")[2] in SETTINGS_MODULES
                and b != AGGREGATE_SETTINGS
                and b not in SHARED_SECTIONS
                and _package(a) != _package(b)
                and layer_of(a, layers) != top
            ):
                out.append(f"{a} -> {b} (another package's section)")
    return out


def check(graph: Mapping[str, set[str]], layers: Sequence = LAYERS) -> dict[str, list[str]]:
    """Every broken rule, by rule; empty lists when the product holds."""
    return {
        "unlayered": unlayered(graph, layers),
        "upward": upward(graph, layers),
        "cycles": ["; ".join(circle_arrows(graph, c)) for c in cycles(graph)],
        "halves": across_halves(graph),
        "settings": settings_arrows(graph, layers),
    }


# -- the product ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def product() -> dict[str, set[str]]:
    return graph_of(product_sources())


def test_the_product_is_walked(product: dict[str, set[str]]) -> None:
    assert len(product) > 200
    assert f"{C}.kube.rest" in product[f"{C}.kube.informer"]
    # typing-only and lazy imports are arrows too
    assert f"{C}.status_cli" in product[f"{C}.cli"]


@pytest.mark.parametrize("rule", ["unlayered", "upward", "cycles", "halves", "settings"])
def test_the_product_keeps_the_rule(product: dict[str, set[str]], rule: str) -> None:
    broken = check(product)[rule]
    assert not broken, f"{rule}:\n  " + "\n  ".join(broken)


def test_the_controller_packages_form_a_total_order(product: dict[str, set[str]]) -> None:
    """No pair of controller packages imports each other, and each layer holds one concept."""
    arrows = {
        (_package(a), _package(b))
        for a, targets in product.items()
        for b in targets
        if a.startswith(C + ".") and b.startswith(C + ".") and _package(a) != _package(b)
    }
    pairs = sorted({tuple(sorted(p)) for p in arrows if (p[1], p[0]) in arrows})
    assert not pairs, f"controller packages that import each other: {pairs}"


# -- the rules fail --------------------------------------------------------------------------

SMALL = (
    ("base", ("p.base",)),
    ("mid", ("p.mid.*",)),
    ("top", ("p.top", "p.settings")),
)


def _small(**sources: str) -> dict[str, set[str]]:
    return graph_of({name.replace("__", "."): src for name, src in sources.items()})


@pytest.mark.parametrize(
    ("graph", "rule", "broken"),
    [
        (
            _small(p__base="from p.mid.a import X\n", p__mid__a="X = 1\n", p__top=""),
            "upward",
            ["p.base (base) -> p.mid.a (mid)"],
        ),
        (
            _small(
                p__base="from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from p.top import T\n",
                p__top="",
            ),
            "upward",
            ["p.base (base) -> p.top (top)"],
        ),
        (
            _small(p__base="def f():\n    import p.top\n", p__top=""),
            "upward",
            ["p.base (base) -> p.top (top)"],
        ),
        (
            _small(p__mid__a="from p.mid import b\n", p__mid__b="from p.mid.a import X\n"),
            "cycles",
            ["p.mid.a -> p.mid.b; p.mid.b -> p.mid.a"],
        ),
        (
            _small(p__top="from p.base import X\n", p__base="X = 1\n", p__other="import p.base\n"),
            "unlayered",
            ["p.other"],
        ),
        (
            _small(p__mid__a="from p.settings import S\n", p__settings=""),
            "upward",
            ["p.mid.a (mid) -> p.settings (top)"],
        ),
        (_small(p__top="from p.mid.a import X\n", p__mid__a="X = 1\n"), "upward", []),
        (_small(p__mid__a="import p.mid.b\n", p__mid__b=""), "cycles", []),
    ],
)
def test_the_rules_fail_on_a_small_product(
    graph: dict[str, set[str]], rule: str, broken: list[str]
) -> None:
    assert check(graph, SMALL)[rule] == broken


def test_the_halves_and_settings_rules_fail() -> None:
    graph = graph_of(
        {
            "gpuhealth.agent.x": "from gpuhealth.controller.fleet.model import F\n",
            "gpuhealth.controller.fleet.model": "from gpuhealth.controller.settings import S\n",
            "gpuhealth.controller.http.api": (
                "from gpuhealth.controller.breaker.settings import B\n"
            ),
            "gpuhealth.controller.fleet.cache": (
                "from gpuhealth.controller.kube.settings import W\n"
            ),
            "gpuhealth.controller.kube.settings": "",
            "gpuhealth.agent.settings": "import gpuhealth.agent.stream.settings\n",
            "gpuhealth.agent.stream.settings": "",
            "gpuhealth.controller.breaker.settings": "",
            "gpuhealth.controller.settings": "import gpuhealth.controller.breaker.settings\n",
            "gpuhealth.controller.compose": "from gpuhealth.controller.settings import S\n",
        }
    )
    broken = check(graph)
    assert broken["halves"] == ["gpuhealth.agent.x -> gpuhealth.controller.fleet.model"]
    assert broken["settings"] == [
        "gpuhealth.controller.fleet.model -> gpuhealth.controller.settings "
        "(the aggregate: the composition's)",
        "gpuhealth.controller.http.api -> gpuhealth.controller.breaker.settings "
        "(another package's section)",
    ]


def test_the_graph_reads_every_form_of_import() -> None:
    graph = graph_of(
        {
            "p": "",
            "p.a": "import p.b\nfrom p import c\nfrom p.d import name\n",
            "p.b": "",
            "p.c": "",
            "p.d": "name = 1\n",
            "p.e": "from p import name_of_init\nfrom . import b\nimport os\n",
        }
    )
    assert graph["p.a"] == {"p.b", "p.c", "p.d"}
    assert graph["p.e"] == {"p"}  # a relative import is not followed (ruff bans them)
