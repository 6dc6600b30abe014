"""Print docs/settings.md: every setting of the agent and controller configs, from the
``Settings`` structs (default and the field's docstring). Run: ``python hack/settings_doc.py >
docs/settings.md``; tests/unit/test_settings_doc.py checks every setting is documented."""

from __future__ import annotations

import ast
import inspect
import json
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import msgspec

from gpuhealth.agent.settings import AgentSettings
from gpuhealth.controller.settings import ControllerSettings


def _field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings: the string literal right after a field's annotated assignment."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, nxt in zip(body, [*body[1:], None], strict=True):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _default(field: msgspec.inspect.Field) -> str:
    if field.default is not msgspec.NODEFAULT:
        value: Any = field.default
    elif field.default_factory is not msgspec.NODEFAULT:
        value = field.default_factory()
    else:
        return "(required)"
    if isinstance(value, msgspec.Struct):
        return ""
    if isinstance(value, set | frozenset):
        value = sorted(value)  # string hashing is randomised per process
    try:
        return json.dumps(msgspec.to_builtins(value))
    except TypeError:
        return str(value)


def rows(root: type) -> Iterator[tuple[str, str, str]]:
    """(path, default, meaning) for every leaf setting under ``root``."""

    def walk(info: Any, path: str) -> Iterator[tuple[str, str, str]]:
        docs = _field_docs(info.cls)
        for f in info.fields:
            name = f"{path}.{f.name}" if path else f.name
            sub = f.type
            if isinstance(sub, msgspec.inspect.UnionType):
                structs = [t for t in sub.types if isinstance(t, msgspec.inspect.StructType)]
                sub = structs[0] if structs else sub
            if isinstance(sub, msgspec.inspect.StructType):
                yield from walk(sub, name)
            elif isinstance(sub, msgspec.inspect.DictType) and isinstance(
                sub.value_type, msgspec.inspect.StructType
            ):
                yield name, _default(f), docs.get(f.name, "")
                yield from walk(sub.value_type, f"{name}.<key>")
            else:
                yield name, _default(f), docs.get(f.name, "")

    yield from walk(msgspec.inspect.type_info(root), "")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def main() -> int:
    out = [
        "# Settings reference",
        "",
        "Every setting of the agent's and the controller's configuration file (`--config FILE`),",
        "with its default and what it does, generated from the `Settings` structs by",
        "`python hack/settings_doc.py > docs/settings.md` (bounds are in the types; the loader",
        "refuses an unknown key or a value out of bounds with the file, line and field).",
        "docs/operations.md explains the ones operators change most; docs/remediation.md the",
        "`remediation:` sections.",
    ]
    for title, root in (("Agent", AgentSettings), ("Controller", ControllerSettings)):
        out += ["", f"## {title}", "", "| setting | default | meaning |", "|---|---|---|"]
        for path, default, doc in rows(root):
            default_cell = f"`{_cell(default)}`" if default else ""
            out.append(f"| `{path}` | {default_cell} | {_cell(doc)} |")
    sys.stdout.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
