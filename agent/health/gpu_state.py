"""Per-GPU health state: the rules applied to one GPU's samples and events.

Pure: no I/O, time comes in as ``now`` (monotonic seconds) and ``at`` (wall time). The
engine (:mod:`agent.health`) routes observations here and turns changes into transitions.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from datetime import datetime

from gpuhealth.agent.health.conditions import (
    SEVERITY_RANK,
    build_condition,
    gpu_info,
    xid_condition,
    xid_message,
)
from gpuhealth.agent.health.hysteresis import Hysteresis, WindowDelta
from gpuhealth.agent.health.settings import HealthSettings
from gpuhealth.agent.health.xid_catalog import XidVerdict
from gpuhealth.agent.observations import GpuIdentity, GpuSample
from gpuhealth.protocol import Condition, GpuTelemetry, HealthState

_THROTTLED = frozenset({"hw_thermal", "sw_thermal", "hw_slowdown", "hw_power_brake"})


def _went_backwards(value: int | None, before: int | None) -> bool:
    return value is not None and before is not None and value < before


def _ratio(v: float | None) -> float | None:
    return None if v is None else min(1.0, max(0.0, v))


class GpuRuleState:
    """Everything the engine knows about one GPU."""

    __slots__ = (
        "app_last",
        "app_xids",
        "conditions",
        "dbe_aggregate",
        "dbe_volatile",
        "identity",
        "info",
        "last_sample_mono",
        "last_timeout",
        "last_xid",
        "latched",
        "nvlink_delta",
        "nvlink_down",
        "pcie_delta",
        "remap_failure",
        "remap_pending",
        "retired_pending",
        "s",
        "sample",
        "sbe_delta",
        "sbe_recent",
        "shutdown",
        "slowdown",
        "state",
        "throttle",
        "w_nvlink",
        "w_pcie",
        "w_sbe",
        "xid_counts",
    )

    def __init__(self, identity: GpuIdentity, settings: HealthSettings) -> None:
        s = settings
        self.s = s
        self.identity = identity
        self.info = gpu_info(identity)
        self.sample: GpuSample | None = None
        self.last_sample_mono: float | None = None
        self.state: HealthState = "unknown"
        self.conditions: dict[str, Condition] = {}
        self.latched: set[str] = set()
        self.xid_counts: dict[int, int] = {}
        self.last_xid: dict[int, tuple[float, str]] = {}
        self.app_xids: deque[float] = deque()
        """Start times of recent bursts of escalating application XIDs."""
        self.app_last: float | None = None
        self.last_timeout: float | None = None
        self.dbe_volatile: int | None = None
        self.dbe_aggregate: int | None = None
        self.sbe_recent = 0
        ra, cw, fc = s.raise_after_samples, s.clean_window_s, max(1, s.flag_confirm_samples)
        self.slowdown = Hysteresis(raise_after=ra, clear_after_s=cw)
        self.shutdown = Hysteresis(raise_after=ra, clear_after_s=cw)
        self.throttle = Hysteresis(raise_after=ra, clear_after_s=cw, sustain_s=s.throttle_sustain_s)
        self.sbe_delta = Hysteresis(raise_after=ra, clear_after_s=cw)
        self.nvlink_delta = Hysteresis(raise_after=ra, clear_after_s=cw)
        self.nvlink_down = Hysteresis(raise_after=ra, clear_after_s=cw)
        self.pcie_delta = Hysteresis(raise_after=ra, clear_after_s=cw)
        self.remap_pending = Hysteresis(raise_after=fc, clear_after_s=cw, clear_after=fc)
        self.retired_pending = Hysteresis(raise_after=fc, clear_after_s=cw, clear_after=fc)
        self.remap_failure = Hysteresis(raise_after=fc, clear_after_s=cw, clear_after=fc)
        self.w_sbe = WindowDelta(s.sbe_rate_window_s)
        self.w_nvlink = WindowDelta(s.nvlink_error_window_s)
        self.w_pcie = WindowDelta(s.pcie_replay_window_s)

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

    def _set(
        self, tracker: Hysteresis, bad: bool, now: float, make: Callable[[], Condition]
    ) -> bool:
        if not tracker.update(bad, now):
            return False
        cond = make()
        if tracker.active:
            return self.raise_(cond)
        return self.drop(cond.code)

    def compute_state(self, now: float) -> HealthState:
        worst = 0
        for c in self.conditions.values():
            r = SEVERITY_RANK.get(c.severity, 0)
            worst = max(worst, r)
        if worst >= 2:
            return "unhealthy" if worst == 3 else "degraded"
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
        s = self.s
        at = smp.at
        changed = False
        if _went_backwards(smp.ecc_dbe_volatile, self.dbe_volatile) or _went_backwards(
            smp.ecc_sbe_volatile, self.w_sbe.last
        ):
            changed = self.reset()  # volatile counters restart at a GPU reset or driver load

        temp = smp.temperature_c
        if temp is not None:
            slow = (smp.slowdown_temperature_c or s.slowdown_temperature_c) - s.temperature_margin_c
            shut = (smp.shutdown_temperature_c or s.shutdown_temperature_c) - s.temperature_margin_c
            changed |= self._set(
                self.slowdown,
                temp >= slow,
                now,
                lambda: build_condition(
                    "thermal", f"temperature {temp:.0f} C at or above slowdown {slow:.0f} C", at
                ),
            )
            changed |= self._set(
                self.shutdown,
                temp >= shut,
                now,
                lambda: build_condition(
                    "thermal-shutdown",
                    f"temperature {temp:.0f} C at or above shutdown {shut:.0f} C",
                    at,
                ),
            )
        reasons = smp.throttle_reasons
        if reasons is not None:
            hit = reasons & s.throttle_reasons
            changed |= self._set(
                self.throttle,
                bool(hit),
                now,
                lambda: build_condition(
                    "thermal-throttle", "sustained throttling: " + ",".join(sorted(hit)), at
                ),
            )

        changed |= self._ecc(smp, now, at)

        if smp.pcie_replay_count is not None:
            d = self.w_pcie.update(smp.pcie_replay_count, now)
            changed |= self._set(
                self.pcie_delta,
                d >= s.pcie_replay_threshold,
                now,
                lambda: build_condition(
                    "pcie-replays", f"{d} PCIe replays within {s.pcie_replay_window_s:.0f} s", at
                ),
            )
        if smp.nvlink_errors is not None:
            d2 = self.w_nvlink.update(smp.nvlink_errors, now)
            changed |= self._set(
                self.nvlink_delta,
                d2 >= s.nvlink_error_threshold,
                now,
                lambda: build_condition(
                    "nvlink-errors",
                    f"{d2} NVLink errors within {s.nvlink_error_window_s:.0f} s",
                    at,
                ),
            )
        up, total = smp.nvlink_links_up, smp.nvlink_links_total
        if s.nvlink_down_degrades and up is not None and total:
            changed |= self._set(
                self.nvlink_down,
                up < total,
                now,
                lambda: build_condition("nvlink-down", f"{total - up} of {total} NVLinks down", at),
            )
        if self.last_timeout is not None and now - self.last_timeout >= s.liveness_clear_s:
            self.last_timeout = None
            changed |= self.drop("gpu-unresponsive")
        return changed

    def _ecc(self, smp: GpuSample, now: float, at: datetime) -> bool:
        changed = False
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
        if new_dbe:
            changed |= self.raise_(
                build_condition(
                    "ecc-dbe", f"{new_dbe} new uncorrectable (double-bit) ECC errors", at
                ),
                latched=True,
            )
        s = self.s
        if smp.ecc_sbe_volatile is not None or smp.ecc_sbe_aggregate is not None:
            sbe = (
                smp.ecc_sbe_volatile if smp.ecc_sbe_volatile is not None else smp.ecc_sbe_aggregate
            )
            d = self.w_sbe.update(sbe, now)
            self.sbe_recent = d
            changed |= self._set(
                self.sbe_delta,
                d >= s.sbe_rate_threshold,
                now,
                lambda: build_condition(
                    "ecc-sbe-rate",
                    f"{d} single-bit ECC errors within {s.sbe_rate_window_s:.0f} s",
                    at,
                ),
            )
        if smp.row_remap_pending is not None:
            changed |= self._set(
                self.remap_pending,
                smp.row_remap_pending,
                now,
                lambda: build_condition(
                    "row-remap-pending",
                    "row remapping pending; takes effect at the next GPU reset",
                    at,
                ),
            )
        if smp.retired_pages_pending is not None:
            changed |= self._set(
                self.retired_pending,
                smp.retired_pages_pending,
                now,
                lambda: build_condition(
                    "retired-pages-pending", "page retirement pending until the next GPU reset", at
                ),
            )
        if smp.row_remap_failure and self.remap_failure.update(True, now):
            changed |= self.raise_(
                build_condition(
                    "row-remap-failure", "row remapping failed: the GPU needs replacing", at
                ),
                latched=True,
            )
        elif smp.row_remap_failure is False:
            self.remap_failure.update(False, now)
        return changed

    # ----------------------------------------------------------------- time

    def expire(self, now: float) -> bool:
        """Clear threshold verdicts whose clean window has passed (called on ticks)."""
        changed = False
        for tracker, code in (
            (self.slowdown, "thermal"),
            (self.shutdown, "thermal-shutdown"),
            (self.throttle, "thermal-throttle"),
            (self.sbe_delta, "ecc-sbe-rate"),
            (self.nvlink_delta, "nvlink-errors"),
            (self.nvlink_down, "nvlink-down"),
            (self.pcie_delta, "pcie-replays"),
        ):
            if tracker.expire(now):
                changed |= self.drop(code)
        s = self.s
        if (
            self.app_last is not None
            and "xid-repeated" in self.conditions
            and now - self.app_last >= s.clean_window_s
        ):
            self.app_xids.clear()
            changed |= self.drop("xid-repeated")
        if (
            self.last_timeout is not None
            and self.last_sample_mono is not None
            and self.last_sample_mono > self.last_timeout
            and now - self.last_timeout >= s.liveness_clear_s
        ):
            self.last_timeout = None
            changed |= self.drop("gpu-unresponsive")
        return changed

    # ----------------------------------------------------------------- events

    def apply_xid(self, v: XidVerdict, now: float, at: datetime, detail: str) -> bool:
        self.xid_counts[v.xid] = self.xid_counts.get(v.xid, 0) + 1
        msg = xid_message(v.message, detail)
        if v.severity != "healthy":
            return self.raise_(xid_condition(v, msg, at), latched=True)
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
        return self.raise_(
            build_condition(
                "xid-repeated",
                f"{len(q)} bursts of application XIDs within "
                f"{s.app_xid_escalation_window_s:.0f} s "
                f"(last: {v.xid})",
                at,
                xid=v.xid,
            ),
        )

    def reset(self) -> bool:
        """GPU reset or reboot: latched verdicts and device flags start over."""
        changed = False
        for code in list(self.latched):
            changed |= self.drop(code)
        for code in ("row-remap-pending", "retired-pages-pending", "gpu-unresponsive",
                     "xid-repeated"):  # fmt: skip
            changed |= self.drop(code)
        self.latched.clear()
        for t in (self.remap_pending, self.retired_pending, self.remap_failure):
            t.reset()
        self.app_xids.clear()
        self.app_last = None
        self.last_xid.clear()
        self.last_timeout = None
        self.dbe_volatile = None
        self.dbe_aggregate = None
        self.w_sbe.reset()
        return changed

    def clear_all(self) -> bool:
        """Operator clear: every verdict goes; a fault still present is raised again."""
        changed = bool(self.conditions)
        self.conditions.clear()
        self.latched.clear()
        for t in (self.slowdown, self.shutdown, self.throttle, self.sbe_delta, self.nvlink_delta,
                  self.nvlink_down, self.pcie_delta, self.remap_pending, self.retired_pending,
                  self.remap_failure):  # fmt: skip
            t.reset()
        self.app_xids.clear()
        self.app_last = None
        self.last_timeout = None
        return changed

    def telemetry(self) -> GpuTelemetry | None:
        smp = self.sample
        if smp is None:
            return None
        reasons = smp.throttle_reasons
        return GpuTelemetry(
            uuid=self.identity.uuid,
            temperature_c=smp.temperature_c,
            slowdown_temperature_c=smp.slowdown_temperature_c,
            shutdown_temperature_c=smp.shutdown_temperature_c,
            power_w=smp.power_w,
            utilization_ratio=_ratio(smp.utilization_ratio),
            memory_bandwidth_ratio=_ratio(smp.memory_utilization_ratio),
            sbe_recent=self.sbe_recent if smp.ecc_sbe_volatile is not None else None,
            throttled=bool(reasons and reasons & _THROTTLED),
        )

    def set_identity(self, identity: GpuIdentity) -> None:
        if identity != self.identity:
            self.identity = identity
            self.info = gpu_info(identity)
