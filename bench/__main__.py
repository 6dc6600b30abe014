"""Run every benchmark, write bench/results.json, print a table (``make bench``).

Each figure is the median of the benchmark's repetitions, with their minimum and maximum
(results.json also keeps the quartiles and every sample). ``-k`` or ``--repeats`` make a
quick run that leaves results.json alone.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import pkgutil
import platform
import sys
import time
from pathlib import Path
from typing import Any

from bench.registry import Benchmark, Target
from bench.stats import spread
from gpuhealth.common.logging import configure as configure_logging

RESULTS = Path(__file__).parent / "results.json"


def _discover() -> list[Benchmark]:
    found: list[Benchmark] = []
    pkg_dir = str(Path(__file__).parent)
    for mod in sorted(pkgutil.iter_modules([pkg_dir]), key=lambda m: m.name):
        if mod.name.startswith("bench_"):
            module = importlib.import_module(f"bench.{mod.name}")
            found.extend(getattr(module, "BENCHMARKS", []))
    return found


def _machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
    }


async def collect_samples(b: Benchmark, repeats: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {}
    for i in range(repeats):
        print(f"bench: {b.name} ({i + 1}/{repeats}) ...", file=sys.stderr, flush=True)
        for metric, value in (await b.run()).items():
            values = [value] if isinstance(value, int | float) else list(value)
            samples.setdefault(metric, []).extend(float(v) for v in values)
    return samples


def result_row(b: Benchmark, t: Target, values: list[float], error: str | None) -> dict[str, Any]:
    row: dict[str, Any] = {"benchmark": b.name, "metric": t.metric}
    if values:
        s = spread(values)
        row |= {
            "value": _round(s.median),
            "min": _round(s.min),
            "max": _round(s.max),
            "q1": _round(s.q1),
            "q3": _round(s.q3),
            "runs": s.n,
            "samples": [_round(v) for v in values],
        }
    else:
        row |= {"value": None, "runs": 0}
    row |= {
        "unit": t.unit,
        "target": f"{t.direction} {t.limit:g}",
        "met": t.met(row["value"]) if values else None,
        "error": error,
    }
    return row


def _round(v: float) -> float:
    return float(f"{v:.5g}")


async def _run(selected: list[Benchmark], repeats: int | None) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for b in selected:
        t0 = time.monotonic()
        try:
            samples = await collect_samples(b, repeats or b.repeats)
            error = None
        except Exception as exc:
            samples, error = {}, f"{type(exc).__name__}: {exc}"
            print(f"bench: {b.name} failed: {error}", file=sys.stderr)
        seconds = round(time.monotonic() - t0, 1)
        for t in b.targets:
            rows.append({**result_row(b, t, samples.get(t.metric, []), error), "seconds": seconds})
    return rows


def merge(report: dict[str, Any], selected: list[Benchmark]) -> dict[str, Any]:
    """results.json with the rows of ``selected`` replaced by ``report``'s (in discovery
    order), each merged row carrying its own measurement date and machine."""
    old = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"results": []}
    names = {b.name for b in selected}
    fresh = [
        {**r, "generated": report["generated"], "machine": report["machine"]}
        for r in report["results"]
    ]
    order = [b.name for b in _discover()]
    rows = [r for r in old.get("results", []) if r.get("benchmark") not in names] + fresh
    rows.sort(key=lambda r: order.index(r["benchmark"]) if r["benchmark"] in order else len(order))
    return {**old, "results": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-k", default="", help="only benchmarks whose name contains this")
    ap.add_argument("--log-level", default="warning", help="log level of in-process components")
    ap.add_argument(
        "--repeats", type=int, help="repetitions of every benchmark (default: each its own)"
    )
    ap.add_argument(
        "--merge",
        action="store_true",
        help="with -k: replace the selected benchmarks' rows in results.json (each merged row "
        "keeps the date it was measured; the report marks them)",
    )
    args = ap.parse_args()
    if args.merge and (not args.k or args.repeats):
        ap.error("--merge needs -k and each benchmark's own repetitions")
    configure_logging(json=False, level=args.log_level)
    selected = [b for b in _discover() if args.k in b.name]
    rows = asyncio.run(_run(selected, args.repeats))
    report: dict[str, Any] = {
        "machine": _machine(),
        "generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "results": rows,
    }
    if not args.k and not args.repeats:
        RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    elif args.merge:
        RESULTS.write_text(json.dumps(merge(report, selected), indent=2) + "\n")
    w = max((len(r["metric"]) for r in rows), default=10)
    print(
        f"machine: {report['machine']['processor']}, {report['machine']['cpus']} CPUs, "
        f"Python {report['machine']['python']}"
    )
    head = f"{'metric':<{w}}  {'median':>14}  {'min - max':>22}  {'n':>3}  {'target':>12}  met"
    print(head)
    for r in rows:
        val = "-" if r["value"] is None else f"{r['value']:g} {r['unit']}"
        rng = "-" if r["value"] is None else f"{r['min']:g} - {r['max']:g}"
        met = {True: "yes", False: "NO", None: "n/a"}[r["met"]]
        print(f"{r['metric']:<{w}}  {val:>14}  {rng:>22}  {r['runs']:>3}  {r['target']:>12}  {met}")
    return 0 if all(r["met"] is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
