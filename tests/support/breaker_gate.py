"""A bare circuit breaker as the remediation loop's hard-write gate (tests only; the product
asks :class:`gpuhealth.controller.breaker.gate.WriteGate`)."""

from __future__ import annotations

from collections.abc import Callable

from gpuhealth.controller.breaker.gate import CircuitBreaker, GateDecision, GateVerdict, HardWrite


class BreakerGate:
    """:class:`HardWriteGate` over the circuit breaker: a node may be disrupted when the
    breaker counts it within its window (the same budget as new hard taints)."""

    def __init__(self, breaker: CircuitBreaker, gpu_nodes: Callable[[], int]) -> None:
        self._breaker = breaker
        self._gpu_nodes = gpu_nodes

    def request(self, write: HardWrite) -> GateDecision:
        verdict = self._breaker.request(write.node, self._gpu_nodes())
        if verdict is GateVerdict.ALLOW:
            return GateDecision(allowed=True)
        return GateDecision(
            allowed=False,
            tripped=verdict is GateVerdict.TRIP,
            reason="BreakerOpen",
            message="the circuit breaker is open: disruptive steps wait for an operator reset",
        )
