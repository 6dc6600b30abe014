"""Latched verdicts saved for a restart on the same boot, forgotten after a reboot."""

from __future__ import annotations

from pathlib import Path

import msgspec

from gpuhealth.agent.state_store import LatchedStore, StateStore
from tests.support.agent import XID79, uuid


def test_latched_store_round_trip_and_reboot(tmp_path: Path) -> None:
    store = LatchedStore(tmp_path, boot_id="boot-1")
    assert store.load() == {}
    store.save({uuid(0): [XID79]})
    assert LatchedStore(tmp_path, boot_id="boot-1").load() == {uuid(0): [XID79]}
    assert LatchedStore(tmp_path, boot_id="boot-2").load() == {}
    StateStore(tmp_path).put_boot_value("latched", "boot-1", b"{not json")
    assert LatchedStore(tmp_path, boot_id="boot-1").load() == {}


def test_an_earlier_agents_latched_file_is_imported(tmp_path: Path) -> None:
    LatchedStore(tmp_path / "old-format", "x")  # (a store elsewhere: only its own dir counts)
    legacy = tmp_path / "latched.json"
    legacy.write_bytes(msgspec.json.encode({"boot_id": "boot-1", "latched": {uuid(0): [XID79]}}))
    assert LatchedStore(tmp_path, boot_id="boot-1").load() == {uuid(0): [XID79]}
    assert not legacy.exists()
