"""The health engine: observations in, per-GPU states and transitions out.

Pure and synchronous: sources call :meth:`HealthEngine.observe` through their sink (cheap,
no I/O) and the runtime calls :meth:`HealthEngine.tick` about once a second for time-based
changes. The model is docs/architecture.md "Agent"; one GPU's tracker lives in
:mod:`gpuhealth.agent.health.gpu_tracker`, the rules in :mod:`gpuhealth.agent.health.rules` and
the XID meanings in :mod:`gpuhealth.agent.health.xid_catalog`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from datetime import datetime

import msgspec

from gpuhealth.agent.counters import Counters, CounterSpec
from gpuhealth.agent.health.conditions import build_condition, condition_sort_key, xid_detail
from gpuhealth.agent.health.fabric import sxid_message
from gpuhealth.agent.health.gpu_tracker import GpuTracker, SeenXid
from gpuhealth.agent.health.op_event_catalog import (
    ATTR_OVERFLOW,
    OpVerdict,
    classify_event,
    driver_release,
)
from gpuhealth.agent.health.rail_settings import RailSettings
from gpuhealth.agent.health.rails import RAIL_CODES, RailBook, RailGpu, RailStatus
from gpuhealth.agent.health.rules import (
    ECC_DBE,
    GPU_LOST,
    GPU_MISSING,
    GPU_UNRESPONSIVE,
    SXID_FATAL,
)
from gpuhealth.agent.health.settings import HealthSettings
from gpuhealth.agent.health.transition import Transition
from gpuhealth.agent.health.xid_catalog import classify
from gpuhealth.agent.observations import (
    EccObservation,
    FabricInfo,
    GpuIdentity,
    GpuSample,
    Inventory,
    LivenessObservation,
    MigDevice,
    NicObservation,
    Observation,
    OperationalEventObservation,
    PciAddress,
    RecoveryActionObservation,
    ResetObservation,
    SxidObservation,
    XidObservation,
)
from gpuhealth.common.clock import Clock
from gpuhealth.common.errors import PermanentError
from gpuhealth.protocol import Condition, GpuStatus, HealthState
from gpuhealth.protocol.v1 import GpuFabric

GOE = "goe"
"""The dedupe source name of a GPU Operational Event's legacy Xid (whatever path brought it)."""
MAX_GROUP_CURSORS = 4096
"""Event-group cursors remembered per GPU (CPER replay dedupe; the driver keeps 64 groups)."""
_ANY_EVENT = "\0event"
_WHOLE_GROUP = "\0group"
"""Marks in a GPU's seen event keys (a module signature never holds a NUL: it is read up to
one): some event of the group was reported; an undecoded CPER record reported the whole group."""

__all__ = ["HealthEngine", "HealthSettings", "UnknownObservationError"]

UNMAPPED_XIDS = CounterSpec(
    "unmapped_xids",
    "XIDs whose GPU could not be identified (no UUID, unknown PCI address): not attributed.",
)
HELD_XIDS = CounterSpec(
    "held_xids",
    "XIDs known only by their PCI address (the kernel log) that arrived before the first GPU "
    "inventory (NVML's first one is slow without persistence mode; the ring buffer's replay "
    "comes first): held until it came, at most health.unmapped_xid_hold_s.",
)
HELD_XIDS_DROPPED = CounterSpec(
    "held_xids_dropped",
    "XIDs held for the first GPU inventory that were dropped: more than "
    "health.unmapped_xid_hold_max waited, or no inventory came within "
    "health.unmapped_xid_hold_s (also counted as unmapped).",
)
DUPLICATE_XIDS = CounterSpec(
    "duplicate_xids",
    "XIDs reported a second time, counted once: by another source (NVML events and the kernel "
    "log) within health.xid_dedup_window_s, or a kernel-log line read again after a restart "
    "(its run stopped before saving its position) while its verdict is latched.",
)
REFINED_XIDS = CounterSpec(
    "refined_xids",
    "XIDs reported a second time within health.xid_dedup_window_s by a source whose message "
    "decides the verdict (XID 154's recovery action, NVLink5 XIDs) where the first report had "
    "none: the later, more specific verdict replaced the first.",
)
UNMAPPED_OP_EVENTS = CounterSpec(
    "unmapped_operational_events",
    "GPU Operational Events without a known GPU UUID: not attributed.",
)
OP_EVENT_OVERFLOWS = CounterSpec(
    "operational_event_overflows",
    "GPU Operational Events whose OVERFLOW attribute says the driver dropped events or "
    "payloads before it (some occurrences were lost).",
)
DUPLICATE_OP_EVENTS = CounterSpec(
    "duplicate_operational_events",
    "GPU Operational Event groups seen a second time (the same group cursor: NVML's event "
    "and the CPER record read back after a restart), counted once.",
)
NONFATAL_SXIDS = CounterSpec(
    "nonfatal_sxids",
    "Non-fatal NVSwitch errors (SXid) from the kernel log: counted, no verdict (the switch "
    "corrected them).",
)
UNKNOWN_OBSERVATIONS = CounterSpec(
    "unknown_observations", "Observations of a type the health engine does not know (rejected)."
)
RDMA_RESETS_SEEN = CounterSpec(
    "rdma_resets_seen",
    "InfiniBand/RoCE port counters that went backwards between two polls (reset by someone, "
    "a driver reload): a new baseline, never read as growth.",
)


class UnknownObservationError(PermanentError):
    """A source handed the engine something that is not an observation it knows."""


class HealthEngine:
    """Per-GPU health state for one node."""

    def __init__(
        self, settings: HealthSettings, clock: Clock, rails: RailSettings | None = None
    ) -> None:
        """``rails``: the rail verdicts' thresholds (``rdma.rails``; None: the defaults)."""
        self.settings = settings
        self._clock = clock
        self._gpus: dict[str, GpuTracker] = {}
        self._by_pci: dict[PciAddress, str] = {}
        """The one place a PCI address is mapped to its GPU (rebuilt with each inventory)."""
        self._inventory: Inventory | None = None
        self._held: deque[tuple[float, XidObservation]] = deque()
        """XIDs known by address only that came before the first inventory (FIFO)."""
        self._taken: list[XidObservation] = []
        """XIDs applied or dropped for good whose ``on_taken`` is still due (:meth:`taken`)."""
        self._node_conditions: dict[str, Condition] = {}
        self._gpus_missing = 0
        """GPUs the node should have and no source can see (node level, not per GPU)."""
        self.counters = Counters(
            UNMAPPED_XIDS,
            HELD_XIDS,
            HELD_XIDS_DROPPED,
            DUPLICATE_XIDS,
            REFINED_XIDS,
            NONFATAL_SXIDS,
            UNKNOWN_OBSERVATIONS,
            UNMAPPED_OP_EVENTS,
            OP_EVENT_OVERFLOWS,
            DUPLICATE_OP_EVENTS,
            RDMA_RESETS_SEEN,
        )
        self._rails = RailBook(rails or RailSettings())
        """The node's InfiniBand and RoCE ports: their verdicts go onto the GPUs behind them."""
        self._op_counts: dict[tuple[str, str, int, str, str], int] = {}
        """(GPU UUID, module, code, category, handled) -> operational events seen."""
        self._cursors: dict[str, dict[tuple[int, str, int], None]] = {}
        """GPU UUID -> event-group cursors seen (insertion order, bounded)."""
        self.node_version = 0
        """Grows whenever :meth:`node_conditions` changes (the stream then sends a Snapshot)."""
        self.devices_version = 0
        """Grows whenever a GPU's MIG devices change (the stream then sends a Snapshot)."""

    # ----------------------------------------------------------------- observe

    def observe(self, obs: Observation) -> list[Transition]:
        """Apply one observation; the transitions it caused (often none).

        Raises :class:`UnknownObservationError` (and counts it) for anything that is not an
        :data:`~gpuhealth.agent.observations.Observation`: a programming error in a source,
        never to be mistaken for a reset or silently dropped."""
        if isinstance(obs, GpuSample):
            return self._sample(obs)
        if isinstance(obs, XidObservation):
            return self._xid(obs)
        if isinstance(obs, OperationalEventObservation):
            return self._op_event(obs)
        if isinstance(obs, Inventory):
            return self._apply_inventory(obs)
        if isinstance(obs, LivenessObservation):
            return self._liveness(obs)
        if isinstance(obs, EccObservation):
            return self._ecc_event(obs)
        if isinstance(obs, ResetObservation):
            return self._reset(obs)
        if isinstance(obs, RecoveryActionObservation):
            return self._recovery(obs)
        if isinstance(obs, SxidObservation):
            return self._sxid(obs)
        if isinstance(obs, NicObservation):
            return self._nics(obs)
        self.counters.inc(UNKNOWN_OBSERVATIONS)
        raise UnknownObservationError(
            f"the health engine does not know observations of type {type(obs).__name__}"
        )

    def _sample(self, smp: GpuSample) -> list[Transition]:
        g = self._gpus.get(smp.uuid) or self._adopt(smp.uuid)
        prev_state = g.state
        now = self._clock.monotonic()
        mig_before = g.mig_key
        fabric_before = _fabric_key(g.sample)
        changed = g.apply_sample(smp, now)
        if g.mig_key != mig_before or _fabric_key(smp) != fabric_before:
            self.devices_version += 1  # a new MIG layout or fabric membership: a new Snapshot
        if not changed and prev_state != "unknown":
            return []
        return self._finish(g, prev_state, changed, smp.at)

    def taken(self) -> list[XidObservation]:
        """The XIDs applied or dropped for good since the last call that carry an ``on_taken``
        (the driver calls it once their transitions are delivered)."""
        out, self._taken = self._taken, []
        return out

    def _settle(self, obs: XidObservation) -> None:
        if obs.on_taken is not None:
            self._taken.append(obs)

    def _xid(self, obs: XidObservation, facts: OpVerdict | None = None) -> list[Transition]:
        """One XID observation. ``facts``: it is the legacy Xid of a GPU Operational Event (the
        event's scope, severity and attributes go onto the verdict; one occurrence however
        many paths report it, in whichever order)."""
        if not obs.uuid and obs.pci is not None and self._inventory is None:
            self._hold(obs)
            return []
        self._settle(obs)
        uuid = obs.uuid or (self._by_pci.get(obs.pci) if obs.pci is not None else None)
        if not uuid:
            self.counters.inc(UNMAPPED_XIDS)
            return []
        g = self._gpus.get(uuid) or self._adopt(uuid)
        now = self._clock.monotonic()
        verdict = classify(obs.xid, obs.message)
        if obs.redelivered and verdict.code in g.latched:
            self.counters.inc(DUPLICATE_XIDS)  # the run before handled it, then stopped
            if facts is not None:  # its structured record, read back: the facts still go on
                return self._apply_facts(g, verdict.code, facts, obs.at, obs.xid)
            return []
        source = GOE if facts is not None else obs.source
        seen = g.last_xid.get(obs.xid)
        refine: str | None = None
        window = self.settings.xid_dedup_window_s
        if seen is not None and GOE in (seen.source, source):
            window = max(window, self.settings.operational_event_window_s)
        if seen is not None and seen.source != source and now - seen.at <= window:
            if facts is not None:  # the structured record of an Xid already counted
                self.counters.inc(DUPLICATE_XIDS)
                g.last_xid[obs.xid] = seen._replace(source=GOE)
                return self._apply_facts(g, verdict.code, facts, obs.at, obs.xid)
            # The same XID from a second source: a duplicate, unless this report says what
            # the first could not (the message decides the verdict and the first had none).
            if not verdict.decoded or seen.decoded:
                self.counters.inc(DUPLICATE_XIDS)
                return []
            refine = seen.action
            self.counters.inc(REFINED_XIDS)
        g.last_xid[obs.xid] = SeenXid(now, source, verdict.decoded, verdict.action)
        if facts is not None and not facts.judged and "simulated" in facts.group:
            return []  # a simulated fault: counted as an event, never a verdict
        prev_state = g.state
        before = g.conditions.get(verdict.code)
        changed = g.apply_xid(
            verdict,
            now,
            obs.at,
            xid_detail(obs),
            refine=refine,
            instance=(obs.gpu_instance, obs.compute_instance),
        )
        if facts is not None:
            changed |= self._facts_onto(g, verdict.code, facts)
        elif before is not None and before.scope is not None:
            changed |= self._keep_scope(g, verdict.code, before)
        out = self._finish(g, prev_state, changed, obs.at, xid=obs.xid)
        if out:
            return out
        return [self._transition(g, "xid", prev_state, obs.at, xid=obs.xid)]

    # ----------------------------------------------------------------- operational events

    def _op_event(self, obs: OperationalEventObservation) -> list[Transition]:
        """One GPU Operational Event: counted once per event group (NVML and CPER report the
        same group cursor); with a legacy Xid judged as that XID (deduplicated with every
        other report of it), else by the event catalog (code, else category)."""
        if obs.attributes & ATTR_OVERFLOW:
            self.counters.inc(OP_EVENT_OVERFLOWS)
        uuid = obs.uuid
        if not uuid:
            self.counters.inc(UNMAPPED_OP_EVENTS)
            return []
        if obs.group_cursor and self._reported(uuid, obs):
            self.counters.inc(DUPLICATE_OP_EVENTS)
            return []
        inv = self._inventory
        v = classify_event(
            obs.module,
            obs.code,
            obs.category,
            obs.severity,
            scope=obs.scope,
            attributes=obs.attributes,
            group_attributes=obs.group_attributes,
            legacy_xid=obs.legacy_xid,
            driver=driver_release(inv.driver_version if inv else None),
        )
        handled = v.handled if v.judged else ",".join(v.group)
        ckey = (uuid, v.module, v.code, v.category, handled)
        self._op_counts[ckey] = self._op_counts.get(ckey, 0) + 1
        if v.legacy_xid:
            # A record read back after a restart is a past occurrence: like a kernel-log line
            # read again, it adds nothing to a verdict already latched.
            xobs = XidObservation(
                source=obs.source,
                xid=v.legacy_xid,
                at=obs.at,
                uuid=uuid,
                redelivered=obs.via == "cper",
            )
            return self._xid(xobs, v)
        g = self._gpus.get(uuid) or self._adopt(uuid)
        if not v.judged or v.severity == "healthy":
            return []
        prev = g.state
        message = v.message
        if obs.via == "cper":
            message += f" (CPER record 0x{obs.group_cursor:x}, read back after the agent was down)"
        cond = Condition(
            reason="OperationalEvent" if v.handled == "code" else "UnknownOperationalEvent",
            code=v.condition_code,
            severity=v.severity,
            action=v.action,
            message=message[:1024],
            since=obs.at,
            scope=v.scope,
        )
        changed = g.raise_(cond, latched=True)
        return self._finish(g, prev, changed, obs.at)

    def _reported(self, uuid: str, obs: OperationalEventObservation) -> bool:
        """Was this event of its group reported already (then it is counted once)? NVML
        delivers each event of a group (they share the cursor, = the CPER record id); a CPER
        record holds the group, one decoded NVIDIA section per event (the same module and
        code), or, undecoded, the whole group as one report. Either path's report of what the
        other brought first is the duplicate. Remembers this one otherwise."""
        seen = self._cursors.setdefault(uuid, {})
        c = obs.group_cursor
        any_event, whole = (c, _ANY_EVENT, 0), (c, _WHOLE_GROUP, 0)
        if obs.decoded:
            key = (c, obs.module, obs.code)
            if key in seen or whole in seen:
                return True
        else:
            key = whole
            if any_event in seen:
                return True
        seen[key] = seen[any_event] = None
        while len(seen) > MAX_GROUP_CURSORS:
            del seen[next(iter(seen))]
        return False

    def _facts_onto(self, g: GpuTracker, code: str, facts: OpVerdict) -> bool:
        """Put a structured event's facts onto the XID condition ``code`` (if raised)."""
        old = g.conditions.get(code)
        if old is None:
            return False
        if "simulated" in facts.group:
            return g.drop(code)  # the structured record says: an injected test fault
        note = f" [{facts.message}]"
        message = old.message if note in old.message else (old.message + note)[:1024]
        new = msgspec.structs.replace(old, scope=facts.scope, message=message)
        if new == old:
            return False
        g.conditions[code] = new
        return True

    def _keep_scope(self, g: GpuTracker, code: str, before: Condition) -> bool:
        """A later report replaced an XID condition: the structured record's facts stay."""
        now = g.conditions.get(code)
        if now is None or now.scope is not None:
            return False
        g.conditions[code] = msgspec.structs.replace(now, scope=before.scope)
        return True

    def _apply_facts(
        self, g: GpuTracker, code: str, facts: OpVerdict, at: datetime, xid: int
    ) -> list[Transition]:
        prev = g.state
        changed = self._facts_onto(g, code, facts)
        return self._finish(g, prev, changed, at, xid=xid if changed else None)

    def op_event_counts(self) -> dict[tuple[str, str, int, str, str], int]:
        """(GPU UUID, module, code, category, handled) -> operational events seen; handled is
        ``code`` (the catalog knows it), ``category`` (judged by its category) or the group
        attributes that kept it from being judged (``simulated``, ``recovered`` ...)."""
        return dict(self._op_counts)

    def _apply_inventory(self, inv: Inventory) -> list[Transition]:
        self._inventory = inv
        out: list[Transition] = []
        present = set()
        for ident in inv.gpus:
            present.add(ident.uuid)
            g = self._gpus.get(ident.uuid)
            if g is None:
                g = self._gpus[ident.uuid] = GpuTracker(ident, self.settings)
            else:
                g.set_identity(ident)
                if GPU_MISSING.code in g.conditions:
                    prev = g.state
                    g.drop(GPU_MISSING.code)
                    out += self._finish(g, prev, True, self._clock.now())
        self._by_pci = {
            pci: u
            for u, g in self._gpus.items()
            if (pci := PciAddress.parse(g.identity.pci_bus_id)) is not None
        }
        for uuid, g in self._gpus.items():
            if uuid not in present and GPU_MISSING.code not in g.conditions:
                out += self._mark_missing(g, self._clock.now(), "not in the GPU inventory")
        while self._held:
            out += self._xid(self._held.popleft()[1])
        return out + self._rail_conditions(self._clock.now())

    def _hold(self, obs: XidObservation) -> None:
        """Keep an address-only XID until the first inventory maps it."""
        self.counters.inc(HELD_XIDS)
        self._held.append((self._clock.monotonic(), obs))
        while len(self._held) > self.settings.unmapped_xid_hold_max:
            self._drop_held()

    def _drop_held(self) -> None:
        _, obs = self._held.popleft()
        self.counters.inc(HELD_XIDS_DROPPED)
        self.counters.inc(UNMAPPED_XIDS)
        self._settle(obs)

    def _mark_missing(self, g: GpuTracker, at: datetime, detail: str) -> list[Transition]:
        prev = g.state
        cond = build_condition(GPU_MISSING, detail, at)
        changed = g.raise_(cond, latched=True)
        return self._finish(g, prev, changed, at)

    def _liveness(self, obs: LivenessObservation) -> list[Transition]:
        if obs.uuid is None:
            self._node_liveness(obs)
            return []
        g = self._gpus.get(obs.uuid) or self._adopt(obs.uuid)
        if obs.kind == "missing":
            return self._mark_missing(g, obs.at, obs.detail or "GPU missing")
        prev = g.state
        now = self._clock.monotonic()
        changed = False
        if obs.kind == "lost":
            changed = g.raise_(
                build_condition(GPU_LOST, obs.detail or "NVML reports the GPU is lost", obs.at),
                latched=True,
            )
        elif obs.kind == "unresponsive":
            g.last_timeout = now
            changed = g.raise_(
                build_condition(
                    GPU_UNRESPONSIVE, obs.detail or "an NVML call passed its deadline", obs.at
                )
            )
        else:  # responsive: calls work again
            changed = g.drop(GPU_LOST.code)
            if (
                g.last_timeout is not None
                and now - g.last_timeout >= self.settings.liveness_clear_s
            ):
                g.last_timeout = None
                changed |= g.drop(GPU_UNRESPONSIVE.code)
        return self._finish(g, prev, changed, obs.at)

    def _node_liveness(self, obs: LivenessObservation) -> None:
        """Fewer GPUs visible than expected: a node condition (a GPU gone from the bus before
        the agent started has no state of its own); it keeps its first ``since``."""
        if obs.kind == "missing":
            shortfall = 1
            if obs.expected is not None and obs.visible is not None:
                shortfall = max(1, obs.expected - obs.visible)
            self._gpus_missing = shortfall
            old = self._node_conditions.get(GPU_MISSING.code)
            message = obs.detail or "fewer GPUs than expected"
            if old is None or old.message != message:
                at = old.since if old is not None and old.since is not None else obs.at
                self._node_conditions[GPU_MISSING.code] = build_condition(GPU_MISSING, message, at)
                self.node_version += 1
        elif obs.kind == "responsive" and GPU_MISSING.code in self._node_conditions:
            del self._node_conditions[GPU_MISSING.code]
            self._gpus_missing = 0
            self.node_version += 1

    def _sxid(self, obs: SxidObservation) -> list[Transition]:
        """A fatal NVSwitch error is a node condition (``nvswitch-fatal``, latched until a
        reboot or an operator clear; it keeps its first ``since``); a non-fatal one is
        counted."""
        if not obs.fatal:
            self.counters.inc(NONFATAL_SXIDS)
            return []
        old = self._node_conditions.get(SXID_FATAL.code)
        if obs.redelivered and old is not None:
            return []
        at = old.since if old is not None and old.since is not None else obs.at
        self._node_conditions[SXID_FATAL.code] = build_condition(SXID_FATAL, sxid_message(obs), at)
        self.node_version += 1
        return []

    def _ecc_event(self, obs: EccObservation) -> list[Transition]:
        if not obs.double_bit:
            return []
        g = self._gpus.get(obs.uuid) or self._adopt(obs.uuid)
        prev = g.state
        changed = g.raise_(
            build_condition(ECC_DBE, "uncorrectable (double-bit) ECC error event", obs.at),
            latched=True,
        )
        return self._finish(g, prev, changed, obs.at)

    def _recovery(self, obs: RecoveryActionObservation) -> list[Transition]:
        g = self._gpus.get(obs.uuid) or self._adopt(obs.uuid)
        prev = g.state
        changed = g.apply_recovery_event(obs.value, self._clock.monotonic(), obs.at)
        return self._finish(g, prev, changed, obs.at)

    def _reset(self, obs: ResetObservation) -> list[Transition]:
        targets = list(self._gpus.values()) if obs.uuid is None else []
        if obs.uuid is not None and obs.uuid in self._gpus:
            targets = [self._gpus[obs.uuid]]
        if obs.uuid is None and self._node_conditions:
            self._node_conditions.clear()
            self._gpus_missing = 0
            self.node_version += 1
        out: list[Transition] = []
        for g in targets:
            prev = g.state
            out += self._finish(g, prev, g.reset(), obs.at)
        return out

    def _nics(self, obs: NicObservation) -> list[Transition]:
        """One poll of the node's InfiniBand and RoCE ports: their verdicts onto the GPUs
        behind them (``rail-*`` conditions)."""
        resets = self._rails.apply(obs, self._clock.monotonic())
        if resets:
            self.counters.inc(RDMA_RESETS_SEEN, resets)
        return self._rail_conditions(obs.at)

    def _rail_conditions(self, at: datetime) -> list[Transition]:
        """Each GPU's rail conditions made what the ports behind which it sits say: raised,
        replaced (another port joined or left), dropped."""
        wanted: dict[str, dict[str, Condition]] = {}
        for pci, conds in self._rails.gpu_conditions().items():
            uuid = self._by_pci.get(pci)
            if uuid is not None:
                wanted[uuid] = conds
        out: list[Transition] = []
        for uuid, g in self._gpus.items():
            want = wanted.get(uuid, {})
            have = {c: cond for c, cond in g.conditions.items() if c in RAIL_CODES}
            if want == have:
                continue
            prev = g.state
            for code in have.keys() - want.keys():
                g.drop(code)
            g.conditions.update(want)
            out += self._finish(g, prev, True, at)
        return out

    # ----------------------------------------------------------------- time and operator

    def tick(self) -> list[Transition]:
        """Time-based changes: clean windows passed, liveness recovered, samples gone stale."""
        now = self._clock.monotonic()
        while self._held and now - self._held[0][0] >= self.settings.unmapped_xid_hold_s:
            self._drop_held()
        at: datetime | None = None
        out: list[Transition] = []
        if self._rails.expire(now, self._clock.now()):
            at = self._clock.now()
            out += self._rail_conditions(at)
        for g in self._gpus.values():
            prev = g.state
            changed = g.expire(now)
            if changed or g.compute_state(now) != prev:
                at = at or self._clock.now()
                out += self._finish(g, prev, changed, at)
        return out

    def clear(self, uuid: str) -> list[Transition]:
        """Operator clear of every verdict on one GPU (a fault still present comes back)."""
        g = self._gpus.get(uuid)
        if g is None:
            return []
        prev = g.state
        pci = PciAddress.parse(g.identity.pci_bus_id)
        if pci is not None:
            self._rails.clear(pci)  # the ports behind which it sits start over
        return self._finish(g, prev, g.clear_all(), self._clock.now())

    # ----------------------------------------------------------------- views

    def statuses(self) -> list[GpuStatus]:
        out = []
        for g in sorted(self._gpus.values(), key=lambda g: g.identity.index):
            conds = sorted(g.conditions.values(), key=condition_sort_key)[:32]
            fabric = g.sample.fabric if g.sample is not None else None
            out.append(
                GpuStatus(
                    info=g.info,
                    state=g.state,
                    conditions=conds,
                    telemetry=g.telemetry(),
                    fabric=None if fabric is None else _fabric_status(fabric),
                )
            )
        return out

    def xid_counts(self) -> dict[tuple[str, int], int]:
        """(GPU UUID, XID) -> how many were seen."""
        out: dict[tuple[str, int], int] = {}
        for u, g in self._gpus.items():
            for (x, _), n in g.xid_counts.items():
                out[(u, x)] = out.get((u, x), 0) + n
        return out

    def xid_action_counts(self) -> dict[tuple[str, int, str], int]:
        """(GPU UUID, XID, the action its verdict named) -> how many were seen: an NVLink5 XID
        NVIDIA's decode says to ignore is counted under IGNORE, not its catalog action."""
        return {(u, x, a): n for u, g in self._gpus.items() for (x, a), n in g.xid_counts.items()}

    def latest_samples(self) -> dict[str, GpuSample]:
        return {u: g.sample for u, g in self._gpus.items() if g.sample is not None}

    def inventory(self) -> Inventory | None:
        return self._inventory

    def gpu_addresses(self) -> list[PciAddress]:
        """The PCI addresses of the GPUs in the inventory (the RDMA source pairs NICs with
        them; the engine maps them back)."""
        return list(self._by_pci)

    def identities(self) -> list[GpuIdentity]:
        """Every GPU the engine knows (inventory, adopted)."""
        return [g.identity for g in self._gpus.values()]

    def mig_devices(self) -> dict[str, tuple[MigDevice, ...]]:
        """GPU UUID -> its MIG devices (GPUs in MIG mode)."""
        return {u: g.mig for u, g in self._gpus.items() if g.mig}

    def nic_ports(self) -> list[RailStatus]:
        """The node's InfiniBand and RoCE ports as judged now, with the GPUs behind them."""
        return self._rails.statuses(self._rail_gpu)

    def _rail_gpu(self, pci: PciAddress) -> RailGpu | None:
        uuid = self._by_pci.get(pci)
        g = self._gpus.get(uuid) if uuid is not None else None
        return None if g is None else RailGpu(g.info.index, uuid or "")

    @property
    def nics_version(self) -> int:
        """Grows whenever what a Snapshot says of the ports changes (a port's state, rate,
        flaps, verdicts; one that comes or goes)."""
        return self._rails.version

    def node_conditions(self) -> list[Condition]:
        """Conditions not tied to one known GPU (fewer GPUs than expected)."""
        return list(self._node_conditions.values())

    def gpus_missing(self) -> int:
        """GPUs the node should have that no source sees (0 when all are visible)."""
        return self._gpus_missing

    def latched(self) -> dict[str, list[Condition]]:
        """Verdicts that hold until reset or clear, for persisting across agent restarts."""
        return {
            u: [g.conditions[c] for c in sorted(g.latched) if c in g.conditions]
            for u, g in self._gpus.items()
            if g.latched
        }

    def restore_latched(self, saved: Mapping[str, Sequence[Condition]]) -> list[Transition]:
        """Re-apply :meth:`latched` output saved before a restart on the same boot."""
        out: list[Transition] = []
        for uuid, conds in saved.items():
            g = self._gpus.get(uuid) or self._adopt(uuid)
            prev = g.state
            changed = False
            for c in conds:
                changed |= g.raise_(c, latched=True)
            out += self._finish(g, prev, changed, self._clock.now())
        return out

    # ----------------------------------------------------------------- helpers

    def _adopt(self, uuid: str) -> GpuTracker:
        """A GPU seen before (or without) an inventory gets a placeholder identity."""
        index = 1 + max((g.identity.index for g in self._gpus.values()), default=-1)
        g = GpuTracker(GpuIdentity(index=index, uuid=uuid, model="", pci_bus_id=""), self.settings)
        self._gpus[uuid] = g
        return g

    def _finish(
        self,
        g: GpuTracker,
        prev: HealthState,
        changed: bool,
        at: datetime,
        *,
        xid: int | None = None,
    ) -> list[Transition]:
        g.state = g.compute_state(self._clock.monotonic())
        if g.state == prev and not changed:
            return []
        return [self._transition(g, "transition", prev, at, xid=xid)]

    def _transition(
        self, g: GpuTracker, kind: str, prev: HealthState, at: datetime, *, xid: int | None
    ) -> Transition:
        conds = tuple(sorted(g.conditions.values(), key=condition_sort_key))
        return Transition(
            kind="xid" if kind == "xid" else "transition",
            uuid=g.identity.uuid,
            index=g.info.index,
            previous=prev,
            current=g.state,
            conditions=conds,
            at=at,
            xid=xid,
        )


def _fabric_key(smp: GpuSample | None) -> tuple[str, str, int] | None:
    """A GPU's fabric membership (state, cluster, clique): a change is worth a Snapshot."""
    f = smp.fabric if smp is not None else None
    return None if f is None else (f.state, f.cluster_uuid, f.clique_id)


def _fabric_status(f: FabricInfo) -> GpuFabric:
    return GpuFabric(
        state=f.state,
        cluster_uuid=f.cluster_uuid,
        clique_id=f.clique_id,
        status=f.status,
        health=sorted(f.health),
    )
