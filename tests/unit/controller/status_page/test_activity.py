"""The status page's activity log: GPU changes, agents and taints, newest first, bounded."""

from __future__ import annotations

from gpuhealth.controller.fleet.model import Fleet
from gpuhealth.controller.names import Keys
from gpuhealth.controller.status_page.activity import ActivityLog
from tests.support.clock import FakeClock
from tests.support.fleet import connect, send_transition
from tests.support.nodes import FakeNodeCache
from tests.support.protocol import XID79

KEYS = Keys()
PREFIX = KEYS.prefix


TAINT = {"key": f"{PREFIX}/unhealthy", "value": "xid-79", "effect": "NoSchedule"}


FOREIGN = {"key": "example.com/maintenance", "value": "", "effect": "NoSchedule"}


def test_event_log_records_gpu_changes_agents_and_taints_newest_first() -> None:
    clock = FakeClock()
    fleet = Fleet(clock=clock)
    nodes = FakeNodeCache()
    log = ActivityLog(KEYS, clock=clock)
    log.attach_fleet(fleet)
    log.attach_nodes(nodes)
    connect(fleet, "n0", 8, state="unknown")  # an agent's first snapshot, before any sample
    clock.advance(1)
    send_transition(fleet, "n0", 3, "healthy")  # not reported yet -> healthy: no news
    send_transition(fleet, "n0", 3, "unhealthy", XID79)
    nodes.set("n0", TAINT, FOREIGN)
    nodes.set("n0", FOREIGN)
    send_transition(fleet, "n0", 3, "healthy")

    got = [(e.kind, e.severity, e.message) for e in log.recent()]
    assert got == [
        ("gpu", "info", "GPU 3: unhealthy -> healthy"),
        ("untaint", "info", f"untainted {PREFIX}/unhealthy=xid-79:NoSchedule"),
        ("taint", "error", f"tainted {PREFIX}/unhealthy=xid-79:NoSchedule"),
        ("gpu", "error", "GPU 3: healthy -> unhealthy: XidError xid-79 (GPU has fallen off the "
                         "bus), action RESTART_BM"),
        ("agent", "info", "agent connected"),
    ]  # fmt: skip


def test_event_log_is_bounded() -> None:
    log = ActivityLog(KEYS, capacity=3, clock=FakeClock())
    for i in range(5):
        log.note("n", "gpu", "info", str(i))
    assert [e.message for e in log.recent()] == ["4", "3", "2"]
    assert [e.message for e in log.recent(1)] == ["4"]
