"""Run every benchmark, write bench/results.json, print a table (``make bench``)."""

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

from bench.registry import Benchmark
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


async def _run(selected: list[Benchmark]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for b in selected:
        t0 = time.monotonic()
        print(f"bench: {b.name} ...", file=sys.stderr, flush=True)
        try:
            values = await b.run()
            error = None
        except Exception as exc:
            values, error = {}, f"{type(exc).__name__}: {exc}"
            print(f"bench: {b.name} failed: {error}", file=sys.stderr)
        for t in b.targets:
            v = values.get(t.metric)
            rows.append(
                {
                    "benchmark": b.name,
                    "metric": t.metric,
                    "value": None if v is None else round(v, 4),
                    "unit": t.unit,
                    "target": f"{t.direction} {t.limit:g}",
                    "met": None if v is None else t.met(v),
                    "error": error,
                    "seconds": round(time.monotonic() - t0, 1),
                }
            )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-k", default="", help="only benchmarks whose name contains this")
    ap.add_argument("--log-level", default="warning", help="log level of in-process components")
    args = ap.parse_args()
    configure_logging(json=False, level=args.log_level)
    selected = [b for b in _discover() if args.k in b.name]
    rows = asyncio.run(_run(selected))
    report = {
        "machine": _machine(),
        "generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "results": rows,
    }
    if not args.k:
        RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    w = max((len(r["metric"]) for r in rows), default=10)
    print(
        f"machine: {report['machine']['processor']}, {report['machine']['cpus']} CPUs, "
        f"Python {report['machine']['python']}"
    )
    print(f"{'metric':<{w}}  {'value':>12}  {'target':>12}  met")
    for r in rows:
        val = "-" if r["value"] is None else f"{r['value']:g} {r['unit']}"
        met = {True: "yes", False: "NO", None: "n/a"}[r["met"]]
        print(f"{r['metric']:<{w}}  {val:>12}  {r['target']:>12}  {met}")
    return 0 if all(r["met"] is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
