"""One module of owned names (``gpuhealth.controller.names``), held to the product, the docs and
the chart.

- No other product module spells a name of ours: the default prefix, the ``/<name>`` of a key
  under the prefix (the ``-<name>`` of an override label under ``node-restriction.kubernetes.io/``),
  or a fixed name (the condition type, its reasons, Event reasons) as a
  string literal (docstrings are prose and do not count).
- docs/operations.md's table of what the controller writes names every one of them.
- The chart spells the same: its ``keyPrefix`` is the default prefix and is handed to the
  controller as ``prefix``; every key it builds from the prefix is one of ours; the agent (and
  the uninstall hook) tolerates exactly the taint keys gpuhealth writes; its RBAC and its CRD
  use gpuhealth's API group.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpuhealth.controller import names
from gpuhealth.controller.names import API_GROUP, DEFAULT_PREFIX, Keys
from gpuhealth.controller.remediation.model import PLURAL
from gpuhealth.controller.settings import ControllerSettings

ROOT = Path(__file__).resolve().parents[3]
SRC = ROOT / "src" / "gpuhealth"
NAMES = SRC / "controller" / "names.py"
OPERATIONS = ROOT / "docs" / "operations.md"
CHART = ROOT / "deploy" / "helm" / "gpuhealth"

NOT_LITERAL_CHECKED = {
    "DEFAULT_PREFIX": "the prefix check covers it (and API_GROUP, the same text)",
    "API_GROUP": "the prefix check covers it",
    "EXCLUDE_VALUE": '"true" is every boolean label\'s value',
    "MANAGED_VALUE": '"true" is every boolean label\'s value',
    "OPT_OUT_VALUE": '"disabled" is an ordinary word',
    "MANAGED_BY_LABEL": "Kubernetes' recommended label, not ours",
    "CONTROLLER": "also the command's and the default Lease's name",
    "GUARD_VALUE": '"true" is every boolean annotation\'s value',
    "NODE_READY_CONDITION": '"Ready": Kubernetes\' own condition type, an ordinary word',
}
"""Fixed names whose text may appear elsewhere, and why."""


def prefixed_names(keys: Keys) -> dict[str, str]:
    """Every key of ours derived from ``keys.prefix``, by its property's name."""
    return {
        attr: getattr(keys, attr)
        for attr, member in vars(Keys).items()
        if isinstance(member, property)
    }


def fixed_names() -> dict[str, str]:
    return {
        name: value
        for name, value in vars(names).items()
        if name.isupper() and isinstance(value, str)
    }


def literal_checked() -> dict[str, str]:
    return {k: v for k, v in fixed_names().items() if k not in NOT_LITERAL_CHECKED}


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings or attribute docstrings (a string
    expression statement: prose, not a value)."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    }


def string_literals(source: str) -> Iterator[str]:
    """Every string constant of the source that is a value, f-string pieces included."""
    tree = ast.parse(source)
    prose = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            yield node.value


def spellings(literal: str) -> list[str]:
    """Which names of ours the literal spells (a key's ``/<name>`` at its end, or followed by
    ``=``, ``:`` or ``,``; the default prefix anywhere; a fixed name as the whole literal)."""
    keys = Keys()
    found = []
    if DEFAULT_PREFIX in literal:
        found.append(DEFAULT_PREFIX)
    for key in prefixed_names(keys).values():
        suffix = key.split(keys.prefix, 1)[1]  # "/unhealthy", or an override's "-exclude"
        if re.search(re.escape(suffix) + r"(?:$|[=:,])", literal):
            found.append(suffix)
    found += [value for value in literal_checked().values() if literal == value]
    return found


def product_modules() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "_pb" not in p.parts and p != NAMES)


def scanned(path: Path, literal: str) -> list[str]:
    """The names of ours ``literal`` in ``path`` spells. The agent writes nothing on
    Kubernetes objects: its own verdicts' reasons (``GpuMissing``) may be a fixed name's text
    and its file paths may end like a key (sysfs's ``ports/1/state``), but it never spells the
    prefix."""
    found = spellings(literal)
    if SRC / "agent" in path.parents:
        found = [n for n in found if n == DEFAULT_PREFIX]
    return found


def test_the_names_are_read() -> None:
    keys = prefixed_names(Keys("x.example"))
    assert keys["unhealthy_taint"] == "x.example/unhealthy"
    assert keys["idle_annotation"] == "x.example/idle-since"
    assert len(keys) >= 20
    assert fixed_names()["CONDITION_TYPE"] == "GPUHealthy"
    assert "REASON_AGENT_MISSING" in literal_checked()
    assert set(NOT_LITERAL_CHECKED) <= set(fixed_names())


OVERRIDES = ("exclude_label", "opt_out_label", "shard_label")
"""Under ``node-restriction.kubernetes.io/``, not under the prefix: the operator's overrides,
and the shard label the singleton writes (a node's kubelet may write none of them)."""


def test_every_key_is_under_the_prefix_and_distinct_where_it_must_be() -> None:
    keys = Keys("x.example")
    for attr, value in prefixed_names(keys).items():
        assert keys.owns(value) == (attr not in OVERRIDES), attr
    # One key, two readings: the old remediation opt-out label and the quarantine taint.
    by_value: dict[str, set[str]] = {}
    for attr, value in prefixed_names(keys).items():
        by_value.setdefault(value, set()).add(attr)
    shared = sorted(sorted(attrs) for attrs in by_value.values() if len(attrs) > 1)
    assert shared == [["old_opt_out_label", "quarantine_taint"]]


def test_the_overrides_are_where_a_kubelet_cannot_write_and_the_old_ones_are_named() -> None:
    keys = Keys("x.example")
    assert keys.exclude_label == "node-restriction.kubernetes.io/x.example-exclude"
    assert keys.opt_out_label == "node-restriction.kubernetes.io/x.example-remediation"
    assert keys.moved_override_labels() == {
        "x.example/exclude": keys.exclude_label,
        "x.example/remediation": keys.opt_out_label,
    }
    assert keys.operator_labels() == {
        keys.exclude_label,
        keys.opt_out_label,
        "x.example/exclude",
        "x.example/remediation",
    }


def test_the_taint_keys_are_every_taint_of_ours() -> None:
    keys = Keys()
    taints = {v for a, v in prefixed_names(keys).items() if a.endswith("_taint")}
    assert set(keys.taint_keys()) == taints and len(keys.taint_keys()) == len(taints) == 4


@pytest.mark.parametrize(
    ("source", "caught"),
    [
        ('K = "gpuhealth.io/unhealthy"\n', ["gpuhealth.io", "/unhealthy"]),
        ('def f(p):\n    return f"{p}/exclude"\n', ["/exclude"]),
        ('def f(p):\n    return f"x/{p}-exclude"\n', ["-exclude"]),
        ('R = "node-restriction.kubernetes.io"\n', ["node-restriction.kubernetes.io"]),
        ('x = {"k": f"{p}/managed=true"}\n', ["/managed"]),
        ('A = "GPUHealthy"\n', ["GPUHealthy"]),
        ('r = reason or "AgentMissing"\n', ["AgentMissing"]),
        ('"""The gpuhealth.io/unhealthy taint (a docstring)."""\n', []),
        ('class C:\n    x = 1\n    """About gpuhealth.io/state."""\n', []),
        ('p = "/api/v1/nodes"\n', []),
        ('p = f"/api/v1/nodes/{n}/status"\n', []),
        ('s = "unhealthy"\n', []),
        ('s = "true"\n', []),
    ],
)
def test_the_scan_sees_every_spelling(source: str, caught: list[str]) -> None:
    assert [n for lit in string_literals(source) for n in spellings(lit)] == caught


def test_no_other_product_module_spells_a_name_of_ours() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}: {literal!r} ({', '.join(found)})"
        for path in product_modules()
        for literal in string_literals(path.read_text(encoding="utf-8"))
        if (found := scanned(path, literal))
    ]
    assert not offenders, (
        "names gpuhealth writes or reads on Kubernetes objects are spelled only in "
        f"controller/names.py: {offenders}"
    )


def _objects_table() -> str:
    text = OPERATIONS.read_text(encoding="utf-8")
    section = re.search(r"^## What the controller writes$(.*?)^## ", text, re.S | re.M)
    assert section, 'docs/operations.md has no "What the controller writes" section'
    rows = [line for line in section.group(1).splitlines() if line.startswith("|")]
    assert len(rows) > 10
    return "\n".join(rows)


def test_the_operations_table_names_every_name() -> None:
    table = _objects_table()
    missing = [key for key in prefixed_names(Keys()).values() if key not in table]
    missing += [
        f"{name} ({value})"
        for name, value in fixed_names().items()
        if name not in ("DEFAULT_PREFIX", "API_GROUP") and value not in table
    ]
    assert not missing, (
        'docs/operations.md "What the controller writes" does not name: ' + ", ".join(missing)
    )


def _templates() -> dict[str, str]:
    return {
        p.name: p.read_text(encoding="utf-8")
        for p in sorted((CHART / "templates").iterdir())
        if p.suffix in (".yaml", ".tpl")
    }


def chart_keys(template: str) -> list[str]:
    """The ``/<name>`` of every key a template builds from ``keyPrefix``: ``printf "%s/x"``,
    and ``printf "%s/%s"`` over a ``range list "x" "y"``."""
    found = [
        f"/{n}" for n in re.findall(r'printf "%s/([a-z0-9.-]+)" [$.]*Values\.keyPrefix', template)
    ]
    for listed in re.findall(r"range list ((?:\"[a-z0-9.-]+\"\s*)+)", template):
        if re.search(r'printf "%s/%s" [$.]*Values\.keyPrefix', template):
            found += [f"/{n}" for n in re.findall(r'"([a-z0-9.-]+)"', listed)]
    return found


@pytest.mark.parametrize(
    ("template", "found"),
    [
        ('key: {{ printf "%s/unhealthy" .Values.keyPrefix }}', ["/unhealthy"]),
        (
            '{{- range list "degraded" "remediation" }}\n'
            '- key: {{ printf "%s/%s" $.Values.keyPrefix . }}',
            ["/degraded", "/remediation"],
        ),
        ("key: nvidia.com/gpu", []),
    ],
)
def test_the_chart_reader_finds_keys(template: str, found: list[str]) -> None:
    assert chart_keys(template) == found


def test_the_charts_prefix_is_the_controllers() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    assert values["keyPrefix"] == DEFAULT_PREFIX == ControllerSettings().prefix
    helpers = _templates()["_helpers.tpl"]
    assert re.search(r'"prefix" \.Values\.keyPrefix', helpers), "the chart must set `prefix`"


@pytest.mark.parametrize("template", ["agent-daemonset.yaml", "cleanup-hook.yaml"])
def test_the_chart_tolerates_every_taint_of_ours(template: str) -> None:
    """A re-created agent pod (a rolling upgrade) must schedule onto a node quarantined by
    remediation or in a tainted NVLink domain: it brings the report that lifts the taint."""
    ours = sorted(key[len(DEFAULT_PREFIX) :] for key in Keys().taint_keys())
    assert sorted(chart_keys(_templates()[template])) == ours


def test_every_key_the_chart_builds_is_ours() -> None:
    ours = {key[len(DEFAULT_PREFIX) :] for key in prefixed_names(Keys()).values()}
    built = {name: chart_keys(text) for name, text in _templates().items()}
    assert built["agent-daemonset.yaml"], "the agent tolerates gpuhealth's own taints"
    assert built["cleanup-hook.yaml"], "the cleanup hook tolerates gpuhealth's own taints"
    stray = {name: sorted(set(found) - ours) for name, found in built.items() if set(found) - ours}
    assert not stray, f"chart keys under keyPrefix that controller/names.py does not own: {stray}"


def test_the_charts_api_group_is_gpuhealths() -> None:
    groups = {
        group
        for text in _templates().values()
        for listed in re.findall(r"apiGroups: \[([^\]]*)\]", text)
        for group in (g.strip().strip('"') for g in listed.split(","))
        if "gpuhealth" in group
    }
    assert groups == {API_GROUP}
    crd = yaml.safe_load(
        (CHART / "files" / "crds" / f"{PLURAL}.{API_GROUP}.yaml").read_text(encoding="utf-8")
    )
    assert (crd["spec"]["group"], crd["metadata"]["name"]) == (API_GROUP, f"{PLURAL}.{API_GROUP}")
