"""The demo's live state: what it has seen so far, its event lines, and the terminal view."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from demo import checks as chk
from demo import timeline
from demo.plan import DemoPlan
from demo.procs import DemoTimings
from demo.view import HOME_CLEAR, Frame, NodeLine, fit, redraw, render


@dataclass(frozen=True)
class DemoSettings:
    nodes: int = 9
    gpus: int = 8
    deadline_s: float = 110.0
    """Seconds after the agents start by which every check must have passed."""
    linger_s: float = 10.0
    """Seconds to keep running once every check passed (time to look at the status page)."""
    poll_interval_s: float = 1.0
    """How often the API server and the controller are read and the view redrawn."""
    controller_ready_s: float = 60.0
    """Longest wait for the controller's /readyz (leader and node cache synced)."""
    agent_ready_s: float = 30.0
    """Longest wait for each agent's /healthz."""
    http_timeout_s: float = 5.0
    """Deadline of one HTTP request to an agent or the controller."""
    workdir: Path | None = None
    """Kept when given; otherwise a temporary directory, removed at the end."""
    keep: bool = False
    tty: bool | None = None
    """Redraw in place with ANSI; None = when stdout is a terminal."""
    timings: DemoTimings = field(default_factory=DemoTimings)
    real_node: bool = False
    """Make the first node a real one: containerd, a kubelet and the test device plugin of
    localkube's node harness (needs root); its agent reads the kubelet's real PodResources."""


@dataclass
class DemoRun:
    """One run: what has been seen so far, the event lines and the view."""

    settings: DemoSettings
    plan: DemoPlan
    out: TextIO
    tty: bool
    started: float = field(default_factory=time.monotonic)
    agents_at: float | None = None
    phase: str = "starting"
    status_url: str = "(controller not started yet)"
    events: list[str] = field(default_factory=list)
    obs: chk.Observations = field(default_factory=chk.Observations)
    gpus: timeline.GpuStates = field(default_factory=dict)
    node_state: dict[str, str] = field(default_factory=dict)
    taints: dict[str, list[str]] = field(default_factory=dict)
    idle: set[str] = field(default_factory=set)
    uuids: dict[str, dict[int, str]] = field(default_factory=dict)
    drawn: bool = False
    status_cli: tuple[int, str] | None = None
    episode_phases: dict[str, str] = field(default_factory=dict)
    """GPURemediation name -> the phase last reported as an event line."""
    replacements: dict[str, str] = field(default_factory=dict)
    """GPURemediation name -> the replacement state last reported as an event line."""
    episodes: list[dict[str, Any]] = field(default_factory=list)
    """The GPURemediations at the last poll (their phase times are printed at the end)."""
    """Exit status and output of ``gpuhealth-controller status`` at the end."""

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def say(self, line: str) -> None:
        stamped = f"[t+{self.elapsed():5.1f}s] {line}"
        self.events.append(stamped)
        if not self.tty:
            print(stamped, file=self.out, flush=True)

    def set_phase(self, phase: str) -> None:
        self.phase = phase
        self.say(phase)

    def frame(self) -> Frame:
        idle_gpus: dict[str, set[int]] = {}
        for p in self.plan.pods:
            if p.name in self.idle:
                idle_gpus.setdefault(p.node, set()).update(p.gpu_indices)
        nodes = [
            NodeLine(
                name=n,
                gpu_states=[s for _, (s, _w) in sorted(self.gpus.get(n, {}).items())],
                state=self.node_state.get(n, "unknown"),
                taints=self.taints.get(n, []),
                idle_gpus=idle_gpus.get(n, set()),
                note=self.plan.notes.get(n, ""),
            )
            for n in self.plan.nodes
        ]
        return Frame(
            elapsed_s=self.elapsed(),
            phase=self.phase,
            status_url=self.status_url,
            nodes=nodes,
            events=self.events,
            checks=[(c.title, chk.evaluate(c, self.obs)) for c in self.plan.checks],
        )

    def draw(self) -> None:
        if self.tty:
            if not self.drawn:
                self.out.write(HOME_CLEAR)
                self.drawn = True
            rows = shutil.get_terminal_size((100, 50)).lines
            events, notes = fit(rows)
            lines = render(self.frame(), colour=True, events_shown=events, notes=notes)
            self.out.write(redraw(lines))
            self.out.flush()
