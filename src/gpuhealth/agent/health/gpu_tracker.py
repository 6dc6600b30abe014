"""One GPU's tracker: the rules (:mod:`gpuhealth.agent.health.rules`, the XID catalog)
applied to its samples and events.

Pure: no I/O, time comes in as ``now`` (monotonic seconds) and ``at`` (wall time). The engine
(:mod:`gpuhealth.agent.health.engine`) routes observations here and turns changes into
transitions. Every sample rule runs the same way, from its row in the table; only what cannot
be a threshold is written out: double-bit ECC errors (any new one latches), liveness and the
escalation of repeated application XIDs.
"""

from __future__ import annotations

from collections import deque
from datetime import datetime
from typing import Any, NamedTuple

import msgspec

from gpuhealth.agent.health.conditions import (
    build_condition,
    gpu_info,
    xid_condition,
    xid_message,
)
from gpuhealth.agent.health.hysteresis import Hysteresis, WindowDelta
from gpuhealth.agent.health.recovery_action import from_value
from gpuhealth.agent.health.rules import (
    ECC_DBE,
    ECC_SBE_RATE,
    GPU_UNRESPONSIVE,
    SAMPLE_RULES,
    VERDICTS,
    XID_REPEATED,
    SampleRule,
    recovery_verdict,
)
from gpuhealth.agent.health.settings import HealthSettings
from gpuhealth.agent.health.xid_catalog import XidVerdict, outranks
from gpuhealth.agent.observations import GpuIdentity, GpuSample, MigDevice
from gpuhealth.protocol import Condition, GpuTelemetry, HealthState, severity, worst_state

_THROTTLED = frozenset({"hw_thermal", "sw_thermal", "hw_slowdown", "hw_power_brake"})


def _went_backwards(value: int | None, before: int | None) -> bool:
    return value is not None and before is not None and value < before


def _ratio(v: float | None) -> float | None:
    return None if v is None else min(1.0, max(0.0, v))


def _tracker(rule: SampleRule, s: HealthSettings) -> Hysteresis:
    if rule.hysteresis == "flag":
        n = max(1, s.flag_confirm_samples)
        return Hysteresis(raise_after=n, clear_after_s=s.clean_window_s, clear_after=n)
    sustain = rule.sustain_s(s) if rule.sustain_s is not None else 0.0
    return Hysteresis(
        raise_after=s.raise_after_samples, clear_after_s=s.clean_window_s, sustain_s=sustain
    )


class SeenXid(NamedTuple):
    """The last report of one XID on one GPU (for the cross-source dedupe window)."""

    at: float
    """Monotonic seconds."""
    source: str
    decoded: bool
    """Its message decided its verdict (see :attr:`XidVerdict.decoded`)."""
    action: str


class GpuTracker:
    """Everything the engine knows about one GPU."""

    __slots__ = (
        "app_last",
        "app_xids",
        "conditions",
        "dbe_aggregate",
        "dbe_volatile",
        "gated",
        "growth",
        "identity",
        "info",
        "last_sample_mono",
        "last_timeout",
        "last_xid",
        "latched",
        "mig",
        "mig_key",
        "rules",
        "s",
        "sample",
        "state",
        "trackers",
        "windows",
        "xid_counts",
    )

    def __init__(self, identity: GpuIdentity, settings: HealthSettings) -> None:
        self.s = settings
        self.identity = identity
        self.info = gpu_info(identity)
        self.sample: GpuSample | None = None
        self.last_sample_mono: float | None = None
        self.state: HealthState = "unknown"
        self.conditions: dict[str, Condition] = {}
        self.latched: set[str] = set()
        self.xid_counts: dict[tuple[int, str], int] = {}
        """(XID, the action its verdict named) -> how many were seen."""
        self.last_xid: dict[int, SeenXid] = {}
        self.app_xids: deque[float] = deque()
        """Start times of recent bursts of escalating application XIDs."""
        self.app_last: float | None = None
        self.last_timeout: float | None = None
        self.dbe_volatile: int | None = None
        self.dbe_aggregate: int | None = None
        self.trackers = {r.verdict.code: _tracker(r, settings) for r in SAMPLE_RULES}
        self.windows = {
            r.verdict.code: WindowDelta(r.window_s(settings))
            for r in SAMPLE_RULES
            if r.window_s is not None
        }
        self.mig: tuple[MigDevice, ...] = ()
        """The MIG devices of the last sample that reported them (usage included)."""
        self.mig_key: tuple[tuple[str, int | None, int | None], ...] = ()
        """Their identities: a change is a new MIG layout (a new GpuInfo)."""
        self.growth: dict[str, int] = {}
        """The last growth each counter rule saw (the SBE one is reported as telemetry)."""
        self.rules = tuple(
            (r, self.trackers[r.verdict.code], self.windows.get(r.verdict.code))
            for r in SAMPLE_RULES
            if r.gate is None
        )
        """Each sample rule with this GPU's tracker and counter window (looked up once)."""
        groups: dict[object, list[tuple[SampleRule, Hysteresis, WindowDelta | None]]] = {}
        for r in SAMPLE_RULES:
            if r.gate is not None:
                groups.setdefault(r.gate, []).append((r, self.trackers[r.verdict.code], None))
        self.gated: list[list[Any]] = [
            [rows[0][0].gate, tuple(rows), False] for rows in groups.values()
        ]
        """Gated rule groups: [gate, rows, holds state]; a group runs only when its gate is
        true or one of its trackers held state after its last run (or was forced since)."""

    # ----------------------------------------------------------------- conditions

    def raise_(self, cond: Condition, *, latched: bool = False) -> bool:
        """Add a condition (keeping the original ``since`` when it is already there)."""
        if latched:
            self.latched.add(cond.code)
        if cond.code in self.conditions:
            return False
        self.conditions[cond.code] = cond
        return True

    def drop(self, code: str) -> bool:
        self.latched.discard(code)
        return self.conditions.pop(code, None) is not None

    def compute_state(self, now: float) -> HealthState:
        worst = worst_state(c.severity for c in self.conditions.values())
        if severity(worst) > severity("healthy") and worst != "unknown":
            return worst
        if self.last_sample_mono is None:
            return "unknown"
        stale = self.s.stale_after_s
        if stale > 0 and now - self.last_sample_mono >= stale:
            return "unknown"
        return "healthy"

    # ----------------------------------------------------------------- samples

    def apply_sample(self, smp: GpuSample, now: float) -> bool:
        """Evaluate every sample rule; return True when the condition set changed."""
        self.sample = smp
        self.last_sample_mono = now
        if smp.mig_devices is not None:
            self._mig(smp.mig_devices)
        changed = False
        sbe_window = self.windows[ECC_SBE_RATE.code]
        if _went_backwards(smp.ecc_dbe_volatile, self.dbe_volatile) or _went_backwards(
            smp.ecc_sbe_volatile, sbe_window.last
        ):
            changed = self.reset()  # volatile counters restart at a GPU reset or driver load
        changed |= self._double_bit(smp)
        for rule, tracker, window in self.rules:
            changed |= self._apply_rule(rule, tracker, window, smp, now)
        for group in self.gated:
            gate, rows, held = group
            if held or gate(smp):
                for rule, tracker, window in rows:
                    changed |= self._apply_rule(rule, tracker, window, smp, now)
                group[2] = any(t.active or t.streak for _, t, _ in rows)
        if self.last_timeout is not None and now - self.last_timeout >= self.s.liveness_clear_s:
            self.last_timeout = None
            changed |= self.drop(GPU_UNRESPONSIVE.code)
        return changed

    def _mig(self, devices: tuple[MigDevice, ...]) -> None:
        self.mig = devices
        key = tuple((m.uuid, m.gpu_instance_id, m.compute_instance_id) for m in devices)
        if key != self.mig_key:
            self.mig_key = key
            self.info = gpu_info(self.identity, devices)

    def _apply_rule(
        self,
        rule: SampleRule,
        tracker: Hysteresis,
        window: WindowDelta | None,
        smp: GpuSample,
        now: float,
    ) -> bool:
        growth = 0
        if rule.counter is not None and window is not None:
            value = rule.counter(smp)
            if value is None:
                return False
            growth = self.growth[rule.verdict.code] = window.update(value, now)
        bad = rule.judge(smp, self.s, growth)
        if bad is None or not tracker.update(bad, now):
            return False
        verdict = rule.verdict
        if tracker.active:
            message = rule.describe(smp, self.s, growth)
            return self.raise_(build_condition(verdict, message, smp.at), latched=verdict.latched)
        return False if verdict.latched else self.drop(verdict.code)

    def _double_bit(self, smp: GpuSample) -> bool:
        """Any new uncorrectable ECC error latches (volatile counter, else the aggregate)."""
        vol, agg = smp.ecc_dbe_volatile, smp.ecc_dbe_aggregate
        prev_vol, prev_agg = self.dbe_volatile, self.dbe_aggregate
        self.dbe_volatile, self.dbe_aggregate = vol, agg
        new_dbe = 0
        if vol is not None:
            if prev_vol is None:
                new_dbe = vol
            elif vol > prev_vol:
                new_dbe = vol - prev_vol
        if not new_dbe and agg is not None and prev_agg is not None and agg > prev_agg:
            new_dbe = agg - prev_agg
        if not new_dbe:
            return False
        message = f"{new_dbe} new uncorrectable (double-bit) ECC errors"
        return self.raise_(build_condition(ECC_DBE, message, smp.at), latched=True)

    # ----------------------------------------------------------------- time

    def expire(self, now: float) -> bool:
        """Clear threshold verdicts whose clean window has passed (called on ticks)."""
        changed = False
        for rule in SAMPLE_RULES:
            if self.trackers[rule.verdict.code].expire(now) and not rule.verdict.latched:
                changed |= self.drop(rule.verdict.code)
        s = self.s
        if (
            self.app_last is not None
            and XID_REPEATED.code in self.conditions
            and now - self.app_last >= s.clean_window_s
        ):
            self.app_xids.clear()
            changed |= self.drop(XID_REPEATED.code)
        if (
            self.last_timeout is not None
            and self.last_sample_mono is not None
            and self.last_sample_mono > self.last_timeout
            and now - self.last_timeout >= s.liveness_clear_s
        ):
            self.last_timeout = None
            changed |= self.drop(GPU_UNRESPONSIVE.code)
        return changed

    # ----------------------------------------------------------------- events

    def apply_xid(
        self,
        v: XidVerdict,
        now: float,
        at: datetime,
        detail: str,
        *,
        refine: str | None = None,
        instance: tuple[int | None, int | None] = (None, None),
    ) -> bool:
        """One XID. ``refine``: the action of an earlier report of the same event (from another
        source, without the message) whose verdict this one replaces (and whose count moves)."""
        if refine is not None:
            earlier = (v.xid, refine)
            left = self.xid_counts.get(earlier, 0) - 1
            if left > 0:
                self.xid_counts[earlier] = left
            else:
                self.xid_counts.pop(earlier, None)
        key = (v.xid, v.action)
        self.xid_counts[key] = self.xid_counts.get(key, 0) + 1
        msg = xid_message(v.message, detail)
        old = self.conditions.get(v.code)
        if v.severity != "healthy":
            cond = xid_condition(v, msg, at, gpu_instance=instance[0], compute_instance=instance[1])
            if old is None:
                return self.raise_(cond, latched=True)
            if refine is None and not outranks(v, old.severity, old.action):
                return False
            self.latched.add(cond.code)
            self.conditions[cond.code] = msgspec.structs.replace(cond, since=old.since)
            return True
        if refine is not None and old is not None:
            return self.drop(v.code)  # the first report's guess; the message says: no fault
        s = self.s
        if v.xid not in s.app_xid_escalation_codes or s.app_xid_escalation_count <= 0:
            return False
        last, self.app_last = self.app_last, now
        if last is not None and now - last < s.app_xid_burst_s:
            return False  # the same burst
        q = self.app_xids
        q.append(now)
        horizon = now - s.app_xid_escalation_window_s
        while q and q[0] < horizon:
            q.popleft()
        if len(q) < s.app_xid_escalation_count:
            return False
        message = (
            f"{len(q)} bursts of application XIDs within "
            f"{s.app_xid_escalation_window_s:.0f} s (last: {v.xid})"
        )
        return self.raise_(build_condition(XID_REPEATED, message, at, xid=v.xid))

    def apply_recovery_event(self, value: int, now: float, at: datetime) -> bool:
        """NVML signalled a new recovery action: its verdict at once (samples clear it)."""
        verdict = recovery_verdict(value)
        if verdict is None:
            return False  # "none": the samples' flag hysteresis clears what was raised
        self.trackers[verdict.code].force(now)
        for group in self.gated:
            group[2] = True  # the forced tracker holds state: its group runs until it clears
        message = (
            f"the driver asks for: {from_value(value).label} "
            f"(GPU recovery action 0x{value:x}, NVML event)"
        )
        return self.raise_(build_condition(verdict, message, at))

    def reset(self) -> bool:
        """GPU reset or reboot: latched verdicts, pending flags and device counters start over."""
        changed = False
        for code in list(self.latched):
            changed |= self.drop(code)
        for verdict in VERDICTS.values():
            if verdict.cleared_by_reset:
                changed |= self.drop(verdict.code)
        self.latched.clear()
        for rule in SAMPLE_RULES:
            if rule.hysteresis == "flag":
                self.trackers[rule.verdict.code].reset()
            if rule.restarts_with_gpu:
                self.windows[rule.verdict.code].reset()
        self.app_xids.clear()
        self.app_last = None
        self.last_xid.clear()
        self.last_timeout = None
        self.dbe_volatile = None
        self.dbe_aggregate = None
        return changed

    def clear_all(self) -> bool:
        """Operator clear: every verdict goes; a fault still present is raised again."""
        changed = bool(self.conditions)
        self.conditions.clear()
        self.latched.clear()
        for tracker in self.trackers.values():
            tracker.reset()
        self.app_xids.clear()
        self.app_last = None
        self.last_timeout = None
        return changed

    def telemetry(self) -> GpuTelemetry | None:
        smp = self.sample
        if smp is None:
            return None
        reasons = smp.throttle_reasons
        sbe_recent = self.growth.get(ECC_SBE_RATE.code, 0)
        return GpuTelemetry(
            uuid=self.identity.uuid,
            temperature_c=smp.temperature_c,
            slowdown_temperature_c=smp.slowdown_temperature_c,
            shutdown_temperature_c=smp.shutdown_temperature_c,
            power_w=smp.power_w,
            utilization_ratio=_ratio(smp.utilization_ratio),
            memory_bandwidth_ratio=_ratio(smp.memory_utilization_ratio),
            sbe_recent=sbe_recent if smp.ecc_sbe_volatile is not None else None,
            throttled=bool(reasons and reasons & _THROTTLED),
        )

    def set_identity(self, identity: GpuIdentity) -> None:
        if identity != self.identity:
            self.identity = identity
            self.info = gpu_info(identity, self.mig)
