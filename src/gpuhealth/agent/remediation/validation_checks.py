"""Validation before a node returns to service, as the agent sees it.

1. every GPU of the order answers NVML (handle, memory, temperature);
2. none of the order's signals (the condition codes the verdict came from) is present and
   every GPU reports healthy, now and for the whole ``soak_s`` window (looked at every
   ``check_interval_s``; the first relapse fails the validation);
3. with ``diagnostic``, the diagnostic hook (``dcgmi diag -r 1``) exits 0. A diagnostic the
   order asks for and the node cannot run (the program is not installed) is a failure,
   ``diagnostic-unavailable``, never a pass: the controller escalates the episode.

The health verdicts come from the agent's own engine (every source: NVML, the kernel log,
dcgm-exporter), through ``statuses``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpuhealth.agent.remediation.command import Runner, available, run_command
from gpuhealth.agent.remediation.nvml_probe import NvmlProbe, NvmlUnavailable, UnknownGpu
from gpuhealth.agent.remediation.order_results import Outcome
from gpuhealth.agent.remediation.settings import ValidationCheckSettings
from gpuhealth.common.clock import Clock
from gpuhealth.protocol import GpuStatus
from gpuhealth.protocol.remediation import CheckResult, ValidateOrder

StatusProvider = Callable[[], Sequence[GpuStatus]]


def signal_problems(order: ValidateOrder, statuses: Sequence[GpuStatus]) -> list[str]:
    """What keeps the order's GPUs from being clean (empty: clean)."""
    by_uuid = {s.info.uuid: s for s in statuses}
    signals = set(order.signals)
    problems = []
    for uuid in order.gpus:
        st = by_uuid.get(uuid)
        if st is None:
            problems.append(f"{uuid} not reported")
            continue
        codes = [c.code for c in st.conditions]
        if st.state != "healthy":
            problems.append(
                f"GPU {st.info.index} {st.state} ({', '.join(codes) or 'no condition'})"
            )
        elif signals & set(codes):
            problems.append(
                f"GPU {st.info.index} still reports {', '.join(sorted(signals & set(codes)))}"
            )
    return problems


class Validator:
    def __init__(
        self,
        probe: NvmlProbe,
        statuses: StatusProvider,
        settings: ValidationCheckSettings,
        clock: Clock,
        *,
        run: Runner = run_command,
        installed: Callable[[tuple[str, ...]], bool] = available,
    ) -> None:
        self._probe = probe
        self._statuses = statuses
        self._settings = settings
        self._clock = clock
        self._run = run
        self._installed = installed

    async def validate(self, order: ValidateOrder, progress: Callable[[Outcome], None]) -> Outcome:
        checks: list[CheckResult] = []
        for uuid in order.gpus:
            try:
                await self._probe.check(uuid)
                checks.append(CheckResult(name=f"nvml:{uuid}"[:128], passed=True))
            except (UnknownGpu, NvmlUnavailable) as exc:
                checks.append(
                    CheckResult(name=f"nvml:{uuid}"[:128], passed=False, message=str(exc)[:1024])
                )
        problems = signal_problems(order, self._statuses())
        checks.append(
            CheckResult(name="signals", passed=not problems, message="; ".join(problems)[:1024])
        )
        if not all(c.passed for c in checks):
            return Outcome(
                "failed", "validation-failed", "the GPUs are not clean", checks=tuple(checks)
            )
        progress(Outcome("running", message=f"soak window of {order.soak_s:g}s"))
        soak = await self._soak(order)
        checks.append(soak)
        if not soak.passed:
            return Outcome("failed", "validation-failed", soak.message, checks=tuple(checks))
        if order.diagnostic:
            argv = self._settings.diagnostic_command
            if not self._installed(argv):
                message = f"could not run: {argv[0]} is not installed"
                checks.append(CheckResult(name="diagnostic", passed=False, message=message))
                return Outcome("failed", "diagnostic-unavailable", message, checks=tuple(checks))
            checks.append(await self._diagnostic())
            if not checks[-1].passed:
                return Outcome(
                    "failed", "diagnostic-failed", checks[-1].message, checks=tuple(checks)
                )
        return Outcome("succeeded", message="validation passed", checks=tuple(checks))

    async def _soak(self, order: ValidateOrder) -> CheckResult:
        end = self._clock.monotonic() + order.soak_s
        while (left := end - self._clock.monotonic()) > 0:
            await self._clock.sleep(min(self._settings.check_interval_s, left))
            problems = signal_problems(order, self._statuses())
            if problems:
                return CheckResult(
                    name="soak", passed=False, message="relapse: " + "; ".join(problems)[:1000]
                )
        return CheckResult(name="soak", passed=True, message=f"{order.soak_s:g}s without a fault")

    async def _diagnostic(self) -> CheckResult:
        argv = self._settings.diagnostic_command
        result = await self._run(argv, self._settings.diagnostic_timeout_s)
        tail = result.output.strip()[-900:]
        if result.returncode == 0:
            return CheckResult(name="diagnostic", passed=True, message=tail[-200:])
        return CheckResult(
            name="diagnostic",
            passed=False,
            message=f"{' '.join(argv)}: {tail or result.returncode}",
        )
