"""Latched verdicts saved for a restart on the same boot, forgotten after a reboot."""

from __future__ import annotations

from pathlib import Path

from gpuhealth.agent.latched_store import LatchedStore
from tests.support.agent import XID79, uuid


def test_latched_store_round_trip_and_reboot(tmp_path: Path) -> None:
    store = LatchedStore(tmp_path, boot_id="boot-1")
    assert store.load() == {}
    store.save({uuid(0): [XID79]})
    assert LatchedStore(tmp_path, boot_id="boot-1").load() == {uuid(0): [XID79]}
    assert LatchedStore(tmp_path, boot_id="boot-2").load() == {}
    (tmp_path / "latched.json").write_text("{not json")
    assert LatchedStore(tmp_path, boot_id="boot-1").load() == {}
