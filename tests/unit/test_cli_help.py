"""Every command's ``--help`` is plain text: no reStructuredText markup from docstrings
(double backticks, ``:class:`` roles) reaches an operator's terminal."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import pytest

from gpuhealth.agent.admin_cli import SUBCOMMANDS as AGENT_SUBCOMMANDS
from gpuhealth.agent.cli import main as agent_main
from gpuhealth.controller.cli import main as controller_main

MARKUP = re.compile(r"``|:(?:class|func|meth|mod|data|attr|exc):`|`[^`\s]+`_?")
COMMANDS: list[tuple[Callable[[Sequence[str] | None], int], list[str]]] = [
    (controller_main, ["--help"]),
    *[(controller_main, [sub, "--help"]) for sub in ("status", "breaker", "incident", "cleanup")],
    (agent_main, ["--help"]),
    *[(agent_main, [sub, "--help"]) for sub in AGENT_SUBCOMMANDS],
]


def test_the_markup_pattern_finds_markup() -> None:
    assert MARKUP.search("run ``gpuhealth-controller``") and MARKUP.search(":class:`Fleet`")
    assert not MARKUP.search("gpuhealth-controller cleanup removes them (--dry-run)")


@pytest.mark.parametrize(
    ("main", "argv"), COMMANDS, ids=lambda v: " ".join(v) if isinstance(v, list) else ""
)
def test_help_is_plain_text(
    main: Callable[[Sequence[str] | None], int], argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: ")
    assert not MARKUP.findall(out), out
