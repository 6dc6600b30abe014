"""``python -m bench.report``: bench/results.json as the README's markdown table.

Each row is one figure: the median of its repetitions with their minimum and maximum, how many
there were, its target and whether the median meets it; the line above the table names the
machine and the date, since the figures mean little without them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results.json"
MET = {True: "yes", False: "**NO**", None: "n/a"}


def _number(value: float | int) -> str:
    return f"{value:,.4g}" if isinstance(value, float) else f"{value:,}"


def _value(row: Mapping[str, Any]) -> str:
    value = row.get("value")
    if value is None:
        return "—"
    unit = str(row.get("unit") or "")
    return f"{_number(value)} {unit}".strip()


def _range(row: Mapping[str, Any]) -> str:
    lo, hi = row.get("min"), row.get("max")
    if row.get("value") is None or lo is None or hi is None:
        return "—"
    return f"{_number(lo)} - {_number(hi)}"


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def machine_line(report: Mapping[str, Any]) -> str:
    m = report.get("machine") or {}
    parts = [
        str(m.get("processor") or "unknown CPU"),
        f"{m.get('cpus', '?')} CPUs",
        f"Python {m.get('python', '?')}",
        str(m.get("platform") or ""),
    ]
    return f"Measured on {', '.join(p for p in parts if p)} at {report.get('generated', '?')}."


def markdown(report: Mapping[str, Any]) -> str:
    rows: Sequence[Mapping[str, Any]] = report.get("results") or []
    lines = [
        machine_line(report),
        "",
        "| Benchmark | Metric | Median | Min - max | Runs | Target | Met |",
        "|---|---|---:|---:|---:|---|:-:|",
    ]
    separate = sorted({str(r["generated"]) for r in rows if r.get("generated")})
    for r in rows:
        target = f"{r.get('target', '')} {r.get('unit') or ''}".strip()
        mark = " †" if r.get("generated") else ""
        met = MET.get(r.get("met"), "n/a")
        if r.get("error"):
            met += f" ({_cell(r['error'])[:80]})"
        lines.append(
            f"| {_cell(r.get('benchmark', ''))}{mark} | `{_cell(r.get('metric', ''))}` "
            f"| {_cell(_value(r))} | {_cell(_range(r))} | {r.get('runs', 1)} "
            f"| {_cell(target)} | {met} |"
        )
    missed = sum(1 for r in rows if r.get("met") is False)
    lines += [
        "",
        f"{len(rows)} figures, {missed} missing their target. Median of the runs; a ratio "
        "compares with a baseline measured in the same run.",
    ]
    if separate:
        lines.append(
            f"† measured separately (`python -m bench --merge -k ...`, same kind of machine) "
            f"at {', '.join(separate)}."
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__)
    ap.add_argument("--results", type=Path, default=RESULTS, help="results file")
    args = ap.parse_args(argv)
    try:
        report = json.loads(args.results.read_text())
    except (OSError, ValueError) as exc:
        print(f"bench.report: cannot read {args.results}: {exc}", file=sys.stderr)
        return 2
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
