"""The demo's live terminal view (pure rendering; the runner decides when to draw).

On a terminal the frame is redrawn in place with ANSI escapes; otherwise the runner prints
plain event lines as they happen and the frame once at the end.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

RESET = "\x1b[0m"
BOLD = "\x1b[1m"
DIM = "\x1b[2m"
COLOURS = {
    "healthy": "\x1b[32m",
    "degraded": "\x1b[33m",
    "unhealthy": "\x1b[31m",
    "unknown": "\x1b[90m",
    "idle": "\x1b[34m",
    "pass": "\x1b[32m",
    "fail": "\x1b[31m",
    "pending": "\x1b[33m",
    "holding": "\x1b[36m",
}
GLYPHS = {"healthy": "●", "degraded": "▲", "unhealthy": "✖", "unknown": "?", "idle": "◌"}
MARKS = {"pass": "✔", "fail": "✘", "pending": "…", "holding": "~"}
HOME_CLEAR = "\x1b[H\x1b[2J"
"""Cursor home and clear screen (before the first frame)."""
HOME = "\x1b[H"
CLEAR_EOL = "\x1b[K"
CLEAR_BELOW = "\x1b[J"


def fit(rows: int) -> tuple[int, bool]:
    """(events shown, notes shown) for a terminal ``rows`` high: notes go first, then events."""
    if rows >= 48:
        return 8, True
    return (8 if rows >= 40 else 3), False


def redraw(lines: Sequence[str]) -> str:
    """A frame drawn over the previous one in place, line by line (no flicker)."""
    return HOME + "".join(f"{line}{CLEAR_EOL}\n" for line in lines) + CLEAR_BELOW


@dataclass
class NodeLine:
    name: str
    gpu_states: list[str]
    state: str
    taints: list[str]
    idle_gpus: set[int] = field(default_factory=set)
    note: str = ""


@dataclass
class Frame:
    elapsed_s: float
    phase: str
    status_url: str
    nodes: list[NodeLine]
    events: list[str]
    checks: list[tuple[str, str]]
    """(title, pass|fail|pending)."""


def _paint(text: str, key: str, colour: bool) -> str:
    return f"{COLOURS[key]}{text}{RESET}" if colour and key in COLOURS else text


def gpu_strip(line: NodeLine, colour: bool) -> str:
    out = []
    for i, state in enumerate(line.gpu_states):
        key = "idle" if i in line.idle_gpus and state == "healthy" else state
        out.append(_paint(GLYPHS.get(key, "?"), key, colour))
    return "".join(out) or "(no report yet)"


def render(
    frame: Frame, *, colour: bool, events_shown: int = 8, notes: bool = True, checks: bool = True
) -> list[str]:
    b = BOLD if colour else ""
    r = RESET if colour else ""
    lines = [
        f"{b}gpuhealth demo{r}  t+{frame.elapsed_s:5.1f}s  {frame.phase}",
        f"status page: {frame.status_url}",
        "",
        f"{b}{'NODE':<12} {'GPUS':<10} {'STATE':<10} TAINTS{r}",
    ]
    for n in frame.nodes:
        strip = gpu_strip(n, colour)
        pad = " " * max(
            0, 10 - max(len(n.gpu_states), len("(no report yet)") if not n.gpu_states else 0)
        )
        state = _paint(f"{n.state:<10}", n.state, colour)
        taints = ", ".join(n.taints) or "-"
        lines.append(f"{n.name:<12} {strip}{pad} {state} {taints}")
        if n.note and notes:
            lines.append(f"{'':<12} {DIM if colour else ''}{n.note}{r}")
    legend = "  ".join(f"{_paint(GLYPHS[k], k, colour)} {k}" for k in GLYPHS)
    lines += ["", f"legend: {legend}", "", f"{b}recent events{r}"]
    lines += [f"  {e}" for e in frame.events[-events_shown:]] or ["  (none yet)"]
    if checks:
        lines += ["", f"{b}checks{r} (taints and idle flags as the API server has them)"]
        for title, status in frame.checks:
            lines.append(f"  {_paint(MARKS[status], status, colour)} {title}")
    return lines


def summary(checks: Sequence[tuple[str, bool]], elapsed_s: float, colour: bool) -> list[str]:
    passed = sum(1 for _, ok in checks if ok)
    lines = [
        f"gpuhealth demo finished after {elapsed_s:.0f}s: {passed}/{len(checks)} checks passed"
    ]
    for title, ok in checks:
        status = "pass" if ok else "fail"
        lines.append(f"  {_paint(MARKS[status], status, colour)} {title}")
    return lines
