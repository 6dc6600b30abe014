"""Observation sinks for source tests."""

from __future__ import annotations

from collections.abc import Callable

from gpuhealth.agent.observations import Observation, XidObservation


def taking(out: list[Observation]) -> Callable[[Observation], None]:
    """Collects observations and, as the engine driver does once the engine applied one,
    confirms each XID at once (the kernel-log follower saves its position then)."""

    def sink(obs: Observation) -> None:
        out.append(obs)
        if isinstance(obs, XidObservation) and obs.on_taken is not None:
            obs.on_taken()

    return sink
