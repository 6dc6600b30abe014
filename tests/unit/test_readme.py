"""The README and the docs tell the truth about commands and benchmarks.

- every ``gpuhealth-controller <sub>`` / ``gpuhealth-agent <sub>`` they name is a subcommand
  the program dispatches (its ``--help`` is the subcommand's own usage, not the main parser's),
  and the README names every subcommand there is;
- the README's benchmark table is ``python -m bench.report`` of bench/results.json.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from bench.report import markdown
from gpuhealth.agent.admin_cli import SUBCOMMANDS as AGENT_SUBCOMMANDS
from gpuhealth.agent.cli import main as agent_main
from gpuhealth.controller.cli import main as controller_main

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = [
    README,
    ROOT / "deploy" / "helm" / "gpuhealth" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "docs" / "runbooks").glob("*.md")),
]
PROGRAMS: dict[str, Callable[[Sequence[str] | None], int]] = {
    "gpuhealth-controller": controller_main,
    "gpuhealth-agent": agent_main,
}
# The subcommands each program dispatches (besides running the component itself).
SUBCOMMANDS = {
    "gpuhealth-controller": {"status", "breaker", "incident", "cleanup"},
    "gpuhealth-agent": set(AGENT_SUBCOMMANDS),
}
NAMED = re.compile(r"(gpuhealth-controller|gpuhealth-agent)\s+([a-z][a-z-]*)")


def _named(paths: Sequence[Path]) -> set[tuple[str, str]]:
    return {(m[1], m[2]) for path in paths for m in NAMED.finditer(path.read_text())}


def _usage(program: str, sub: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        PROGRAMS[program]([sub, "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out.splitlines()[0]


@pytest.mark.parametrize(
    ("program", "sub"), sorted({(p, s) for p, subs in SUBCOMMANDS.items() for s in subs})
)
def test_each_subcommand_is_dispatched(
    program: str, sub: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _usage(program, sub, capsys).startswith(f"usage: {program} {sub} ")


def test_an_unknown_subcommand_gets_the_main_usage(capsys: pytest.CaptureFixture[str]) -> None:
    # What the check above tells apart: a word the program does not dispatch.
    assert not _usage("gpuhealth-controller", "bogus", capsys).startswith(
        "usage: gpuhealth-controller bogus"
    )


def test_the_docs_name_only_real_subcommands() -> None:
    named = _named(DOCS)
    assert ("gpuhealth-controller", "cleanup") in named
    unknown = sorted(f"{p} {s}" for p, s in named if s not in SUBCOMMANDS[p])
    assert not unknown, f"the docs name commands that do not exist: {unknown}"


def test_the_readme_names_every_subcommand() -> None:
    named = _named([README])
    missing = sorted(
        f"{p} {s}" for p, subs in SUBCOMMANDS.items() for s in subs if (p, s) not in named
    )
    assert not missing, f"README.md does not mention: {missing}"


def test_the_readme_bench_table_is_the_results() -> None:
    table = markdown(json.loads((ROOT / "bench" / "results.json").read_text())).strip()
    assert table in README.read_text(), (
        "README.md's benchmark table differs from bench/results.json: "
        "paste the output of `python -m bench.report`"
    )
