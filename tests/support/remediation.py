"""Shared builders for the remediation unit tests: settings, a runner over a World, a driver."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
from prometheus_client import CollectorRegistry

from gpuhealth.controller.remediation.metrics import RemediationMetrics
from gpuhealth.controller.remediation.model import Episode, Phase
from gpuhealth.controller.remediation.runner import Ports, RemediationRunner
from gpuhealth.controller.remediation.settings import (
    EscalateSettings,
    RebootSettings,
    RemediationSettings,
    ResetSettings,
    SafetySettings,
    ValidationSettings,
)
from tests.fakes.remediation_world import KEYS, World


def settings(**changes: Any) -> RemediationSettings:
    """Everything on, no approval, no soak, generous caps; ``changes`` on top."""
    base = RemediationSettings(
        enabled=True,
        reset_gpu=ResetSettings(enabled=True),
        reboot=RebootSettings(enabled=True, approval_required=False),
        escalate=EscalateSettings(enabled=True),
        validation=ValidationSettings(soak_s=0.0),
        safety=SafetySettings(max_concurrent=100, max_fraction=1.0),
    )
    return msgspec.structs.replace(base, **changes)


def runner_for(
    world: World, cfg: RemediationSettings, *, registry: CollectorRegistry | None = None
) -> RemediationRunner:
    ports = Ports(
        store=world.store,
        nodes=world,
        pods=world,
        disruptor=world,
        orders=world,
        reports=world.book,
        quarantiner=world,
        gate=world,
        events=world,
        replacer=world,
    )
    metrics = RemediationMetrics(registry or CollectorRegistry())
    return RemediationRunner(cfg, KEYS, ports, metrics, world.clock)


async def one_round(world: World, runner: RemediationRunner) -> None:
    """What the controller does after a change: consider every node, pass every episode,
    then let the world react (pods terminate, nodes reboot, taints follow)."""
    for node in sorted(world.nodes):
        await runner.consider(node)
    for ep in sorted(world.store.episodes(), key=lambda e: e.name):
        await runner.reconcile(ep.name)
    world.settle()


async def drive(
    world: World,
    runner: RemediationRunner,
    until: Callable[[], bool],
    *,
    rounds: int = 80,
    tick_s: float = 5.0,
) -> None:
    for _ in range(rounds):
        await one_round(world, runner)
        if until():
            return
        world.advance(tick_s)
    phases = {e.name: (e.phase.value, e.status.reason) for e in world.store.episodes()}
    raise AssertionError(f"condition not reached after {rounds} rounds: {phases}")


def only(world: World) -> Episode:
    episodes = world.store.episodes()
    assert len(episodes) == 1, [e.name for e in episodes]
    return episodes[0]


def phase_is(world: World, phase: Phase) -> Callable[[], bool]:
    return lambda: any(e.phase is phase for e in world.store.episodes())


def finished(world: World) -> Callable[[], bool]:
    return lambda: (
        bool(world.store.episodes())
        and all(
            e.phase is Phase.RETURNED and e.status.times.returned is not None
            for e in world.store.episodes()
        )
    )
