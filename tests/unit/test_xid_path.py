"""The path of one XID, from the kernel-log reader to the Node patch, walked in the code.

**The walk** (:data:`WALK`) is the path as data: the hops, in order, each a product function
through which the XID goes on. A hop receives the XID's data in one of its forms (the kernel
line, the ``XidObservation``, the verdict, the ``Transition``, the ``Event``, the frame, the
GPU's health, the desired node, the plan) and hands it on, or returns to the hop that asked a
decision about it that the path goes on with (what the XID means, the GPU's condition and
state, the controller's word on it, the desired node, the patch, whether the write may
happen). Every hop after the first is tied to an earlier one by a link, checked two ways:

- **in the source** (AST): a *call* link: the earlier hop's body (nested functions included)
  calls the name the link gives (``self._ctx.sink(...)``: ``sink``); a *return* link: this
  hop's body calls the earlier hop (the send loop asks the outbox for the next frame); a
  *hand-off* across a thread, a task or the wire: the earlier hop's body touches the name
  given for its side and this hop's body the name given for its own (the outbox's
  ``_entries``, the work queue's ``_ready``; the WebSocket: ``send_bytes`` on the agent,
  ``feed_data`` on the controller);
- **at run time**: one ``NVRM: Xid ... 79`` line is written to a followed kernel-log file and
  flows through the production agent (``build_agent``: the follower, the engine driver, the
  health engine, the stream client and its outbox) over a real WebSocket on 127.0.0.1 into
  the production controller (``build_controller``: the stream, the incident judge, the fleet,
  the reconciler, the write gate) up to the Node patch, with a recording API client in place
  of the API server. ``sys.setprofile`` records who called whom among product functions
  (library frames in between are transparent): every call link must appear as an edge from
  the earlier hop's code (or a function nested in it) to this hop's code, every return link
  the other way, and both sides of every hand-off must have run.

The run-time trace also keeps the walk complete: every product module that the code of a hop
(with the same-module functions it called) called into is either a module of the walk or
listed in :data:`CONSULTED` with why it is not on the path, and every module listed there was
called into. A new module on the path fails here until it is a hop (and counted) or explained.

**The count** is the number of distinct modules of the walk (a module counts once, however
often the path comes back to it), except:

- hops in the **infrastructure layers** under gpuhealth's concepts (:data:`INFRASTRUCTURE`,
  as ``tests/unit/test_layers.py`` orders the product: ``common``, ``names``, ``aiohttp``,
  ``kube``, ``utilities``): code that moves what it is given without knowing it is an XID,
  which the data crosses as it crosses a library's. On this path: aiohttp's seam through which
  the frame parser hands a frame to the stream (``aiohttp_internals._FrameQueue``), and the
  work queue (``workqueue.py``), which carries only the node's name to a level-triggered
  worker that reads the data itself from the fleet. Which hops these are is read from
  :data:`~tests.unit.test_layers.LAYERS`, not declared here;
- hops **beside** the path (:data:`BESIDE`): a durable copy that nothing on the path reads back
  (the state store: the Event's outbox row, in the same transaction as the latched verdict and
  the kernel-log position; the send loop sends from the outbox's memory, the next start reads
  the rows).

What a hop consults to make its own step is not a hop (:data:`CONSULTED`): the value types the
data takes the form of and their builders (``XidObservation``, ``PciAddress``, the
``Condition`` of a verdict, ``Transition``, ``Event``, ``NodeHealth``, ``NodePlan``), helpers
that hold no decision about this XID (the severity order, owned names, settings, the clock,
counters and metrics), the other inputs of a decision (the Node as the watch cache has it,
the remediation loop's quarantine, the NVLink domain's taint, leadership), the other consumers
of a change (the fleet's other listeners, DRA device taints), and what lies past the Node
patch call (the REST client that carries the request, the Node it answers). The count must
be at most :data:`MAX_MODULES`; docs/architecture.md "The path of one XID" names the walk's
modules and functions, table row by row in the walk's order, and states the rule and the
number (checked here).
"""

from __future__ import annotations

import ast
import asyncio
import importlib
import json
import re
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FrameType
from typing import Any, Literal

import pytest
from aiohttp.test_utils import TestServer

import gpuhealth
from tests.unit.test_layers import LAYERS, layer_of

ROOT = Path(__file__).resolve().parents[2]
SRC = Path(gpuhealth.__file__).resolve().parent
DOC = ROOT / "docs" / "architecture.md"
MAX_MODULES = 20

# -- the walk -------------------------------------------------------------------------------

LinkKind = Literal["call", "return", "handoff"]


@dataclass(frozen=True, slots=True)
class Link:
    """How a hop is reached from the earlier hop ``source`` (a qualified name in the walk)."""

    kind: LinkKind
    source: str
    name: str
    """call: the name ``source`` calls; return: the name this hop calls; handoff: what
    ``source`` touches."""
    take: str = ""
    """handoff: what this hop touches (empty: ``name``, a shared attribute)."""


def call(source: str, name: str) -> Link:
    return Link("call", source, name)


def returned(source: str, name: str) -> Link:
    return Link("return", source, name)


def handoff(source: str, put: str, take: str = "") -> Link:
    return Link("handoff", source, put, take or put)


@dataclass(frozen=True, slots=True)
class Hop:
    module: str
    """Its path under ``src/gpuhealth/``, as docs/architecture.md names it."""
    qualname: str
    links: tuple[Link, ...] = ()

    @property
    def dotted(self) -> str:
        return "gpuhealth." + self.module.removesuffix(".py").replace("/", ".")


def hop(module: str, qualname: str, *links: Link) -> Hop:
    return Hop(module, qualname, links)


KMSG = "agent/sources/kmsg/"
HEALTH = "agent/health/"
AGENT_STREAM = "agent/stream/"
STREAM = "controller/stream/"
FLEET = "controller/fleet/model.py"
TAINTS = "controller/taints/"
CODEC = "protocol/codec.py"

AGENT: tuple[Hop, ...] = (
    # the reader thread reads the line of the followed file
    hop(KMSG + "readers.py", "pump"),
    # the reader thread calls the run's push, which hands the line to the event loop (a
    # queue inside KmsgSource.run); the run's reading takes it
    hop(KMSG + "source.py", "KmsgSource.run", call("pump", "push")),
    hop(KMSG + "source.py", "Reading.take", call("KmsgSource.run", "take")),
    hop(KMSG + "source.py", "Reading._file_line", call("Reading.take", "_file_line")),
    hop(KMSG + "source.py", "Reading._hand_on", call("Reading._file_line", "_hand_on")),
    hop(KMSG + "source.py", "KmsgSource.observation", call("Reading._hand_on", "observe")),
    hop(KMSG + "parser.py", "strip_prefix", call("KmsgSource.observation", "strip_prefix")),
    hop(KMSG + "parser.py", "parse_line", call("KmsgSource.observation", "parse_line")),
    # the XidObservation to the sink: the engine driver
    hop("agent/engine_driver.py", "EngineDriver.observe", call("Reading._hand_on", "sink")),
    hop(HEALTH + "engine.py", "HealthEngine.observe", call("EngineDriver.observe", "observe")),
    hop(HEALTH + "engine.py", "HealthEngine._xid", call("HealthEngine.observe", "_xid")),
    hop(HEALTH + "engine.py", "HealthEngine._finish", call("HealthEngine._xid", "_finish")),
    hop(
        HEALTH + "engine.py",
        "HealthEngine._transition",
        call("HealthEngine._finish", "_transition"),
    ),
    hop(HEALTH + "xid_catalog.py", "classify", call("HealthEngine._xid", "classify")),
    hop(HEALTH + "gpu_tracker.py", "GpuTracker.apply_xid", call("HealthEngine._xid", "apply_xid")),
    hop(
        HEALTH + "gpu_tracker.py",
        "GpuTracker.compute_state",
        call("HealthEngine._finish", "compute_state"),
    ),
    # the Transition to the driver's listener: the stream client
    hop(
        "agent/engine_driver.py", "EngineDriver._deliver", call("EngineDriver.observe", "_deliver")
    ),
    hop(
        "agent/engine_driver.py", "EngineDriver._publish", call("EngineDriver._deliver", "_publish")
    ),
    hop(
        AGENT_STREAM + "client.py",
        "StreamClient.publish",
        call("EngineDriver._publish", "listener"),
    ),
    hop(
        AGENT_STREAM + "client.py", "StreamClient._append", call("StreamClient.publish", "_append")
    ),
    hop(
        AGENT_STREAM + "client.py",
        "event_from_transition",
        call("StreamClient.publish", "event_from_transition"),
    ),
    hop(AGENT_STREAM + "outbox.py", "Outbox.append", call("StreamClient._append", "append")),
    hop(CODEC, "encode", call("Outbox.append", "encode")),
    hop("agent/state_store.py", "StateStore.outbox_put", call("Outbox.append", "outbox_put")),
    # the frame waits in the outbox for the send loop
    hop(AGENT_STREAM + "outbox.py", "Outbox.next_after", handoff("Outbox.append", "_entries")),
    hop(
        AGENT_STREAM + "client.py",
        "StreamClient._send_loop",
        returned("Outbox.next_after", "next_after"),
    ),
)

CONTROLLER: tuple[Hop, ...] = (
    # the WebSocket: the agent writes the frame, the accepted stream feeds the frame parser
    hop(
        STREAM + "agent_socket.py",
        "AgentStream.data_received",
        handoff("StreamClient._send_loop", "send_bytes", "feed_data"),
    ),
    hop(
        "controller/aiohttp_internals.py",
        "_FrameQueue.feed_data",
        call("AgentStream.data_received", "feed_data"),
    ),
    hop(
        STREAM + "agent_socket.py",
        "AgentStream.received",
        call("_FrameQueue.feed_data", "received"),
    ),
    hop(STREAM + "session.py", "Connection.on_message", call("AgentStream.received", "on_message")),
    hop(STREAM + "session.py", "Connection.apply", call("Connection.on_message", "apply")),
    hop(STREAM + "session.py", "Session.on_frame", call("Connection.apply", "on_frame")),
    hop(STREAM + "session.py", "Session.on_message", call("Session.on_frame", "on_message")),
    hop(CODEC, "decode_agent", call("Session.on_frame", "decode_agent")),
    # the stream's sink: the judge, in front of the fleet
    hop(
        "controller/incidents/judge.py",
        "IncidentJudge.on_message",
        call("Session.on_message", "on_message"),
    ),
    hop(
        "controller/incidents/judge.py",
        "IncidentJudge._event",
        call("IncidentJudge.on_message", "_event"),
    ),
    hop(
        "controller/incidents/judge.py",
        "IncidentJudge._overlay",
        call("IncidentJudge._event", "_overlay"),
    ),
    hop("controller/incidents/overlay.py", "overlay", call("IncidentJudge._overlay", "overlay")),
    hop(FLEET, "Fleet.on_message", call("IncidentJudge.on_message", "on_message")),
    hop(FLEET, "Fleet._apply_event", call("Fleet.on_message", "_apply_event")),
    hop(FLEET, "Fleet._notify", call("Fleet.on_message", "_notify")),
    # the fleet's listener queues the node's name; a node worker takes it
    hop(TAINTS + "reconciler.py", "Reconciler._on_fleet_change", call("Fleet._notify", "listener")),
    hop("controller/workqueue.py", "WorkQueue.add", call("Reconciler._on_fleet_change", "add")),
    hop("controller/workqueue.py", "WorkQueue.get", handoff("WorkQueue.add", "_ready")),
    hop("controller/workqueue.py", "run_worker", returned("WorkQueue.get", "get")),
    hop(TAINTS + "reconciler.py", "Reconciler._reconcile_counted", call("run_worker", "handle")),
    hop(
        TAINTS + "reconciler.py",
        "Reconciler.reconcile",
        call("Reconciler._reconcile_counted", "reconcile"),
    ),
    hop(TAINTS + "reconciler.py", "Reconciler.plan", call("Reconciler.reconcile", "plan")),
    hop(TAINTS + "reconciler.py", "Reconciler.desired", call("Reconciler.plan", "desired")),
    # the worker reads the GPU's health where the fleet keeps it
    hop(
        FLEET,
        "Fleet.node_health",
        call("Reconciler.desired", "node_health"),
        handoff("Fleet._apply_event", "conditions"),
    ),
    hop(TAINTS + "policy.py", "desired_node", call("Reconciler.desired", "desired_node")),
    hop(TAINTS + "plan.py", "plan_node", call("Reconciler.plan", "plan_node")),
    hop("controller/breaker/gate.py", "WriteGate.request", call("Reconciler.plan", "request")),
    hop(TAINTS + "node_api.py", "NodeApi.patch", call("Reconciler.reconcile", "patch")),
)

WALK: tuple[Hop, ...] = AGENT + CONTROLLER
"""From the kernel-log reader (the agent's first hop) to the Node patch (the last)."""

INFRASTRUCTURE = ("common", "names", "aiohttp", "kube", "utilities")
"""The layers of ``tests/unit/test_layers.py`` under gpuhealth's concepts: walked, not
counted."""
BESIDE = {
    "agent/state_store.py": "the Event's durable copy (with the latched verdict and the "
    "kernel-log position, one transaction); the send loop sends from the outbox's memory, "
    "only the next start reads the rows",
}
"""Modules of the walk that the data passes beside the path: walked, not counted."""

VALUE = "a value type the data takes the form of, or its builder"
HELPER = "consulted in passing: holds no decision about this XID"
INPUT = "another input of a decision, not the XID's data"
BRANCH = "another consumer of the change, beside the path"
PAST = "past the Node patch call"

CONSULTED: Mapping[str, str] = {
    "agent/observations.py": f"{VALUE}: the XidObservation's PciAddress",
    "agent/health/conditions.py": f"{VALUE}: the verdict as a protocol Condition, its message, "
    "the order of conditions",
    "protocol/v1.py": f"{HELPER}: the one severity order of health states",
    "agent/counters.py": f"{HELPER}: the follower's counters",
    "agent/sources/kmsg/file_start.py": "beside: each line's fingerprint, for the position",
    "agent/node_snapshot.py": f"{BRANCH}: the node snapshot marked stale",
    "controller/incidents/settings.py": f"{HELPER}: the judge's settings (is XID 79 an "
    "application XID?)",
    "controller/fleet/cache.py": f"{BRANCH}: the fleet's listener for the fleet API",
    "controller/placement/view.py": f"{BRANCH}: the fleet's listener for the scheduler extender",
    "controller/idle/tracker.py": f"{BRANCH}: the fleet's listener for idle allocations",
    "controller/status_page/activity.py": f"{BRANCH}: the fleet's listener for the activity log",
    "controller/incidents/domain_monitor.py": f"{BRANCH}: the fleet's listener for NVLink "
    f"domains; {INPUT}: the domain taint",
    "controller/names.py": f"{HELPER}: the owned names (Keys)",
    "common/clock.py": f"{HELPER}: the clock",
    "controller/remediation/assembly.py": f"{INPUT}: the remediation loop's quarantine taint",
    "controller/incidents/overrides.py": f"{INPUT}: the node's taints removed by hand (the "
    "override incidents: not put back)",
    "controller/taints/mig_scope.py": f"{BRANCH}: the GPU's DRA devices",
    "controller/taints/device_taints.py": f"{BRANCH}: DRA device taints",
    "controller/compose.py": f"{INPUT}: the gate's leadership and node count",
    "controller/kube/node_cache.py": f"{INPUT}: the Node as the watch cache has it",
    "controller/kube/rest.py": f"{PAST}: the request's transport",
    "controller/kube/node_view.py": f"{PAST}: the Node it answers",
}
"""Product modules the walk's code calls into that are not on the path, and why."""


def by_name(walk: Sequence[Hop] = WALK) -> dict[str, Hop]:
    return {h.qualname: h for h in walk}


def infrastructure(h: Hop) -> bool:
    index = layer_of(h.dotted)
    return index is not None and LAYERS[index][0] in INFRASTRUCTURE


def counted_modules(walk: Sequence[Hop] = WALK) -> list[str]:
    """The walk's modules that count, in the order the walk first passes them."""
    out: list[str] = []
    for h in walk:
        if not infrastructure(h) and h.module not in BESIDE and h.module not in out:
            out.append(h.module)
    return out


# -- the source -----------------------------------------------------------------------------


def definition(module: str, qualname: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The ``def`` of ``qualname`` (``Class.method`` or ``function``) in ``module``."""
    path = SRC / module
    if not path.is_file():
        return None
    body: list[ast.stmt] = ast.parse(path.read_text(encoding="utf-8")).body
    *outer, name = qualname.split(".")
    for part in outer:
        cls = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == part), None)
        if cls is None:
            return None
        body = cls.body
    return next(
        (
            n
            for n in body
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name
        ),
        None,
    )


def calls(node: ast.AST, name: str) -> bool:
    """``node`` (nested functions included) calls ``name(...)`` or ``x.name(...)``."""
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            f = n.func
            if (isinstance(f, ast.Name) and f.id == name) or (
                isinstance(f, ast.Attribute) and f.attr == name
            ):
                return True
    return False


def touches(node: ast.AST, name: str) -> bool:
    """``node`` uses the attribute or name ``name``."""
    return any(
        (isinstance(n, ast.Attribute) and n.attr == name)
        or (isinstance(n, ast.Name) and n.id == name)
        for n in ast.walk(node)
    )


def static_problems(walk: Sequence[Hop] = WALK) -> list[str]:
    """Every hop that does not exist, and every link the source does not show."""
    problems: list[str] = []
    names = by_name(walk)
    seen: set[str] = set()
    defs = {h.qualname: definition(h.module, h.qualname) for h in walk}
    if len(defs) != len(walk):
        problems.append("a qualified name is two hops of the walk")
    for i, h in enumerate(walk):
        here = defs[h.qualname]
        if here is None:
            problems.append(f"{h.module}: no {h.qualname}")
        if i > 0 and not h.links:
            problems.append(f"{h.qualname}: no link from an earlier hop")
        for link in h.links:
            if link.source not in seen:
                problems.append(f"{h.qualname}: linked from {link.source}, not an earlier hop")
                continue
            there = defs[link.source]
            if here is None or there is None:
                continue
            if not in_source(link, there, here):
                problems.append(
                    f"{names[link.source].module}: {describe(link, h)} not in the source"
                )
        seen.add(h.qualname)
    return problems


def in_source(link: Link, source: ast.AST, here: ast.AST) -> bool:
    if link.kind == "call":
        return calls(source, link.name)
    if link.kind == "return":
        return calls(here, link.name)
    return touches(source, link.name) and touches(here, link.take)


def describe(link: Link, h: Hop) -> str:
    if link.kind == "call":
        return f"{link.source} -> {h.qualname} (calls {link.name})"
    if link.kind == "return":
        return f"{h.qualname} <- {link.source} (calls {link.name})"
    return f"{link.source} ~> {h.qualname} (hand-off: {link.name} / {link.take})"


# -- run time -------------------------------------------------------------------------------


def code_of(h: Hop) -> CodeType:
    obj: Any = importlib.import_module(h.dotted)
    for part in h.qualname.split("."):
        obj = getattr(obj, part)
    code: CodeType = obj.__code__
    return code


def nested(code: CodeType) -> set[CodeType]:
    """``code`` and every function, lambda and comprehension defined inside it."""
    out = {code}
    for const in code.co_consts:
        if isinstance(const, CodeType):
            out |= nested(const)
    return out


@dataclass
class Trace:
    """Caller -> callee among product functions (library frames between them skipped), and
    when each function was first and last called."""

    edges: set[tuple[CodeType | None, CodeType]] = field(default_factory=set)
    first: dict[CodeType, int] = field(default_factory=dict)
    last: dict[CodeType, int] = field(default_factory=dict)
    active: bool = False
    _n: int = 0

    def profile(self, frame: FrameType, event: str, arg: object) -> None:
        if event != "call" or not self.active:
            return
        code = frame.f_code
        if not code.co_filename.startswith(str(SRC)):
            return
        caller = frame.f_back
        while caller is not None and not caller.f_code.co_filename.startswith(str(SRC)):
            caller = caller.f_back
        self._n += 1
        self.first.setdefault(code, self._n)
        self.last[code] = self._n
        self.edges.add((caller.f_code if caller is not None else None, code))


def module_of(code: CodeType) -> str:
    return Path(code.co_filename).resolve().relative_to(SRC).as_posix()


def run_problems(trace: Trace, walk: Sequence[Hop] = WALK) -> list[str]:
    """Every link the run did not show."""
    problems: list[str] = []
    codes = {h.qualname: nested(code_of(h)) for h in walk}
    for h in walk:
        for link in h.links:
            source, here = codes[link.source], codes[h.qualname]
            if link.kind == "call":
                ok = any(a in source and b in here for a, b in trace.edges)
            elif link.kind == "return":
                ok = any(a in here and b in source for a, b in trace.edges)
            else:
                put = min((trace.first[c] for c in source if c in trace.first), default=None)
                take = max((trace.last[c] for c in here if c in trace.last), default=None)
                ok = put is not None and take is not None and take > put
            if not ok:
                problems.append(describe(link, h))
    return problems


def called_into(trace: Trace, walk: Sequence[Hop] = WALK) -> dict[str, set[str]]:
    """Product modules outside the walk that the walk's code called: each hop with the
    functions of its own module it called (at run time), and what they called; by module,
    with the callers."""
    modules = {h.module for h in walk}
    extent: set[CodeType] = set()
    for h in walk:
        extent |= nested(code_of(h))
    grew = True
    while grew:
        grew = False
        for a, b in trace.edges:
            if a in extent and b not in extent and module_of(b) == module_of(a):
                extent.add(b)
                grew = True
    out: dict[str, set[str]] = {}
    for a, b in trace.edges:
        if a in extent and module_of(b) not in modules:
            out.setdefault(module_of(b), set()).add(f"{module_of(a)}:{a.co_qualname}")
    return out


# -- one XID, through the production agent and controller -----------------------------------

NODE = "node-a"
LINE = (
    "Nov 22 10:00:00 node-a kernel: [  219.470994] NVRM: Xid (PCI:0000:1b:00): 79, "
    "pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
)
"""GPU 3 of ``tests.support.agent``'s inventory has the address 00000000:1B:00.0."""
TAINT = "gpuhealth.io/unhealthy"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


class _Answer:
    def __init__(self, status: int, obj: object) -> None:
        self.status = status
        self._data = json.dumps(obj).encode()

    async def read(self) -> bytes:
        return self._data

    def release(self) -> None:
        pass


class RecordingApi:
    """In place of the API server, what ``controller/kube/rest.py`` calls: the agent's token
    reviewed (bound to its node), the Node patched as a merge patch, everything else
    accepted; every request recorded."""

    def __init__(self) -> None:
        self.node: dict[str, Any] = {
            "metadata": {"name": NODE, "uid": "node-uid", "resourceVersion": "1"},
            "status": {"capacity": {"nvidia.com/gpu": "8"}},
        }
        self.requests: list[tuple[str, str, Any]] = []

    async def call_api(self, path: str, method: str, *, body: Any = None, **_: object) -> _Answer:
        self.requests.append((method, path, body))
        if path.endswith("/tokenreviews"):
            return _Answer(201, {"status": self._agent()})
        if method == "PATCH" and path == f"/api/v1/nodes/{NODE}":
            meta = {k: v for k, v in body.get("metadata", {}).items() if k != "resourceVersion"}
            self.node = merge_patch(self.node, {**body, "metadata": meta})
            rv = self.node["metadata"]["resourceVersion"]
            self.node["metadata"]["resourceVersion"] = str(int(rv) + 1)
        if path.startswith(f"/api/v1/nodes/{NODE}"):
            return _Answer(200, self.node)
        return _Answer(201, {})

    def tainted(self) -> bool:
        return any(t.get("key") == TAINT for t in self.node.get("spec", {}).get("taints", []))

    @staticmethod
    def _agent() -> dict[str, Any]:
        prefix = "authentication.kubernetes.io/"
        return {
            "authenticated": True,
            "audiences": ["gpuhealth"],
            "user": {
                "username": "system:serviceaccount:gpuhealth:gpuhealth-agent",
                "uid": "agent-sa-uid",
                "extra": {
                    prefix + "node-name": [NODE],
                    prefix + "pod-name": ["gpuhealth-agent-x"],
                    prefix + "pod-uid": ["agent-pod-uid"],
                },
            },
        }


async def one_xid(tmp: Path, trace: Trace) -> RecordingApi:
    """The agent and the controller as production builds them, connected; then, traced, one
    XID 79 line from the followed kernel log to the Node patch that taints the node."""
    from gpuhealth.agent.observations import Inventory
    from gpuhealth.agent.settings import load_config as agent_config
    from gpuhealth.agent.sources.kmsg.source import KmsgSource
    from gpuhealth.agent.wiring import build_agent
    from gpuhealth.controller.compose import build_controller
    from gpuhealth.controller.kube.node_view import NodeView
    from gpuhealth.controller.settings import load_config as controller_config
    from gpuhealth.controller.stream.agent_socket import AgentStream
    from tests.support.agent import full_sample, identity
    from tests.support.clock import FakeClock
    from tests.support.wait import until

    api = RecordingApi()
    cfg = controller_config(None, {"kubeconfig": "unused", "stream": {"watch_agent_pods": False}})
    ctl = build_controller(cfg, api)
    ctl.parts.elector.is_leader = True  # this replica leads, as its elector would say
    ctl.parts.leader_work.ready = True  # and has adopted what it must before writing
    ctl.parts.cache.update(NodeView(name=NODE, resource_version="1", gpus=8))
    server = TestServer(ctl.web_app(), host="127.0.0.1", port=0)
    await server.start_server()
    kern_log, token, state = tmp / "kern.log", tmp / "token", tmp / "state"
    kern_log.write_text("")
    token.write_text("agent-token")
    state.mkdir()
    app = build_agent(
        agent_config(
            None,
            {
                "node_name": NODE,
                "state_dir": str(state),
                "source": "sim",
                "kmsg_path": str(kern_log),
                "controller_url": f"ws://127.0.0.1:{server.port}/v1/stream",
                "token_file": str(token),
                "podresources": {"enabled": False},
            },
        ),
        clock=FakeClock(),
        boot_id="boot-1",
    )
    follower = next(s for s in app.sources if isinstance(s, KmsgSource))
    stream = app.parts.stream
    assert stream is not None
    app.driver.observe(Inventory(source="sim", gpus=(identity(3),)))
    app.driver.observe(full_sample(3))
    tasks = [asyncio.create_task(ctl.parts.reconciler.run()), asyncio.create_task(stream.run())]
    threading.setprofile(trace.profile)  # the reader thread starts with the follower
    try:
        tasks.append(asyncio.create_task(follower.run(app.driver.observe)))
        await until(lambda: follower.ready, "the follower to attach")
        await until(
            lambda: isinstance(
                getattr(ctl.parts.stream.connections.get(NODE), "ws", None), AgentStream
            ),
            "the agent's stream accepted and handed over",
        )
        await until(lambda: (rec := ctl.parts.fleet.node(NODE)) is not None and rec.has_snapshot)
        await until(lambda: api.node.get("metadata", {}).get("labels"), "the first reconcile")
        await until(ctl.parts.reconciler.idle, "the reconciler to go idle")
        assert not api.tainted()
        trace.active = True
        sys.setprofile(trace.profile)
        try:
            with kern_log.open("a") as f:
                f.write(LINE)
            await until(api.tainted, "the Node patch that taints the node")
        finally:
            sys.setprofile(None)
            trace.active = False
    finally:
        threading.setprofile(None)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await ctl.parts.reconciler.close()
        await server.close()
        if app.parts.outbox is not None:
            app.parts.outbox.close()
        if app.parts.store is not None:
            app.parts.store.close()
    return api


@pytest.fixture(scope="module")
def traced() -> Iterator[Trace]:
    trace = Trace()
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(one_xid(Path(tmp), trace))
    yield trace


# -- the doc --------------------------------------------------------------------------------

TOKEN = re.compile(r"`([^`\s]+)`")


def stations(walk: Sequence[Hop]) -> list[tuple[str, list[str]]]:
    """The walk as the doc's rows: consecutive hops in one module, with their functions."""
    out: list[tuple[str, list[str]]] = []
    for h in walk:
        if out and out[-1][0] == h.module:
            out[-1][1].append(h.qualname)
        else:
            out.append((h.module, [h.qualname]))
    return out


def doc_section() -> str:
    parts = re.split(r"^## (.+)$", DOC.read_text(encoding="utf-8"), flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))["The path of one XID"]


def doc_rows(section: str, heading: str) -> list[tuple[str, list[str]]]:
    """(module, functions) of each row of the table under ``### <heading>...``: the module
    cell's path and the functions cell's names (the last two cells)."""
    table = next(p for p in section.split("### ") if p.startswith(heading))
    rows = []
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.lstrip().startswith("|") or len(cells) < 4 or not cells[0].isdigit():
            continue
        rows.append((" ".join(TOKEN.findall(cells[-2])), TOKEN.findall(cells[-1])))
    return rows


# -- tests ----------------------------------------------------------------------------------


def test_every_hop_exists_and_every_link_is_in_the_source() -> None:
    problems = static_problems()
    assert not problems, "the walk does not match the source:\n" + "\n".join(problems)


def test_one_xid_takes_every_link_of_the_walk(traced: Trace) -> None:
    problems = run_problems(traced)
    assert not problems, "links one XID did not take at run time:\n" + "\n".join(problems)


def test_the_walk_is_complete(traced: Trace) -> None:
    entered = called_into(traced)
    unexplained = {m: sorted(c) for m, c in entered.items() if m not in CONSULTED}
    assert not unexplained, (
        "the walk's code calls modules that are neither hops nor explained in CONSULTED "
        f"(module: callers): {json.dumps(unexplained, indent=1)}"
    )
    stale = sorted(set(CONSULTED) - set(entered))
    assert not stale, f"CONSULTED lists modules the walk's code never called: {stale}"


def test_the_path_of_one_xid_passes_at_most_twenty_modules() -> None:
    modules = counted_modules()
    assert "controller/incidents/overlay.py" in modules  # the judge and its overlay count
    assert "controller/aiohttp_internals.py" not in modules  # an infrastructure layer
    assert len(modules) <= MAX_MODULES, (
        f"the path of one XID passes {len(modules)} modules (at most {MAX_MODULES}): {modules}"
    )


def test_the_doc_tables_are_the_walk() -> None:
    section = doc_section()
    for heading, half in (("In the agent", AGENT), ("In the controller", CONTROLLER)):
        rows = doc_rows(section, heading)
        want = stations(half)
        assert rows == want, (
            f'docs/architecture.md "{heading}": its rows must name the walk\'s modules and '
            f"functions in order\n doc:  {rows}\n walk: {want}"
        )


def test_the_doc_states_the_count() -> None:
    numbers = re.findall(r"passes \*\*(\d+)\*\* modules", doc_section())
    assert numbers == [str(len(counted_modules()))], numbers


# -- the checks themselves can fail ---------------------------------------------------------


def test_a_missing_hop_or_link_is_found_in_the_source() -> None:
    gone = hop(FLEET, "Fleet.no_such_method", call("IncidentJudge.on_message", "on_message"))
    wrong = hop(FLEET, "Fleet.on_message", call("IncidentJudge.on_message", "no_such_call"))
    later = hop(FLEET, "Fleet.on_message", call("Fleet._notify", "on_message"))
    judge = hop("controller/incidents/judge.py", "IncidentJudge.on_message")
    assert static_problems((judge, gone)) == [f"{FLEET}: no Fleet.no_such_method"]
    assert "calls no_such_call" in static_problems((judge, wrong))[0]
    assert "not an earlier hop" in static_problems((judge, later))[0]
    shared = hop(FLEET, "Fleet.node_health", handoff("IncidentJudge.on_message", "_no_such"))
    assert "hand-off" in static_problems((judge, shared))[0]


def test_a_link_not_taken_is_found_at_run_time() -> None:
    a, b = (
        hop(FLEET, "Fleet.on_message"),
        hop(FLEET, "Fleet._notify", call("Fleet.on_message", "_notify")),
    )
    code_a, code_b = code_of(a), code_of(b)
    trace = Trace(
        edges={(code_a, code_b)}, first={code_a: 1, code_b: 2}, last={code_a: 1, code_b: 2}
    )
    assert run_problems(trace, (a, b)) == []
    back = hop(FLEET, "Fleet._notify", returned("Fleet.on_message", "on_message"))
    assert run_problems(trace, (a, back)) == [describe(back.links[0], back)]
    later = hop(FLEET, "Fleet._notify", handoff("Fleet.on_message", "x"))
    early = Trace(edges=set(), first={code_a: 2, code_b: 1}, last={code_a: 2, code_b: 1})
    assert run_problems(early, (a, later)) == [describe(later.links[0], later)]


def test_the_count_leaves_out_only_infrastructure_and_beside() -> None:
    assert infrastructure(hop("controller/workqueue.py", "run_worker"))
    assert infrastructure(hop("controller/aiohttp_internals.py", "_FrameQueue.feed_data"))
    assert not infrastructure(hop(FLEET, "Fleet.on_message"))
    walk = (hop(FLEET, "Fleet.on_message"), hop("agent/state_store.py", "StateStore.outbox_put"))
    assert counted_modules(walk) == [FLEET]
    assert doc_rows(
        "### In the x\n| # | a | m | f |\n| 1 | a | `m.py` | `f`, `g` |\n", "In the x"
    ) == [("m.py", ["f", "g"])]
