"""DCGM_FI_DEV_XID_ERRORS holds the last XID forever: only a change is a new XID."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuhealth.agent.observations import XidObservation
from gpuhealth.agent.sources.dcgm.settings import DcgmSettings
from gpuhealth.agent.sources.dcgm.source import DCGM_XID_BASELINES, DCGM_XIDS, DcgmExporterSource
from gpuhealth.agent.sources.dcgm.xid_baseline import NAME, XidBaseline, XidChange
from gpuhealth.agent.state_store import StateStore
from gpuhealth.common.errors import ConfigError
from tests.support.clock import FakeClock
from tests.support.dcgm_exposition import Instance, gpu, render

NEW, SAME, BASELINE = XidChange.NEW, XidChange.SAME, XidChange.BASELINE


@pytest.mark.parametrize(
    ("values", "verdicts"),
    [
        ([0, 0, 79], [SAME, SAME, NEW]),  # clean GPU, then an XID
        ([79], [BASELINE]),  # days-old XID at start: not new
        ([79, 79, 79], [BASELINE, SAME, SAME]),
        ([79, 48], [BASELINE, NEW]),
        ([13, 13, 48, 48, 13], [BASELINE, SAME, NEW, SAME, NEW]),
        ([79, 0, 79], [BASELINE, SAME, NEW]),  # DCGM restarted (value cleared), then 79 again
    ],
)
def test_only_a_change_is_new(values: list[int], verdicts: list[XidChange]) -> None:
    b = XidBaseline(None, "boot-a")
    assert [b.judge("GPU-1", v) for v in values] == verdicts


def test_gpus_are_judged_apart() -> None:
    b = XidBaseline(None, "boot-a")
    assert b.judge("GPU-1", 79) is BASELINE
    assert b.judge("GPU-2", 0) is SAME
    assert b.judge("GPU-2", 79) is NEW


def test_the_baseline_survives_a_restart(tmp_path: Path) -> None:
    first = XidBaseline(tmp_path, "boot-a")
    assert first.judge("GPU-1", 79) is BASELINE
    assert first.judge("GPU-2", 0) is SAME
    first.save()
    again = XidBaseline(tmp_path, "boot-a")
    assert again.judge("GPU-1", 79) is SAME  # not re-reported after the restart
    assert again.judge("GPU-2", 48) is NEW  # arrived while the agent was down


def test_after_a_reboot_any_xid_is_from_this_boot(tmp_path: Path) -> None:
    before = XidBaseline(tmp_path, "boot-a")
    before.judge("GPU-1", 79)
    before.save()
    after = XidBaseline(tmp_path, "boot-b")
    assert after.judge("GPU-1", 79) is NEW  # DCGM started after the reboot: it is new
    assert after.judge("GPU-2", 0) is SAME


@pytest.mark.parametrize("content", [b"", b"{not json", b'{"GPU-1": "x"}'])
def test_an_unreadable_baseline_is_a_fresh_one(tmp_path: Path, content: bytes) -> None:
    StateStore(tmp_path).put_boot_value(NAME, "boot-a", content)
    b = XidBaseline(tmp_path, "boot-a")
    assert b.judge("GPU-1", 79) is BASELINE
    b.save()
    assert XidBaseline(tmp_path, "boot-a").judge("GPU-1", 79) is SAME


def test_save_writes_only_changes(tmp_path: Path) -> None:
    b = XidBaseline(tmp_path, "boot-a")
    b.judge("GPU-1", 79)
    b.save()
    store = StateStore(tmp_path)
    store.put_boot_value(NAME, "boot-a", b"tampered")
    b.judge("GPU-1", 79)
    b.save()  # nothing changed: not written again
    assert store.boot_value(NAME, "boot-a") == (b"tampered", False)


def test_an_unusable_state_dir_is_refused_at_start(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError):
        XidBaseline(blocker / "state", "boot-a")


def test_a_failed_write_is_logged_not_raised(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    b = XidBaseline(store, "boot-a")
    store.close()  # every statement fails now
    b.judge("GPU-1", 79)
    b.save()
    assert store.write_errors >= 1


def _source(tmp_path: Path) -> DcgmExporterSource:
    return DcgmExporterSource(
        "http://127.0.0.1:9/metrics",
        DcgmSettings(),
        FakeClock(),
        state=str(tmp_path),
        boot_id="boot-a",
    )


def _xids(src: DcgmExporterSource, text: str) -> list[tuple[int, str | None]]:
    return [(o.xid, o.uuid) for o in src.parse(text) if isinstance(o, XidObservation)]


def test_source_baselines_then_reports_changes_across_restarts(tmp_path: Path) -> None:
    g0, g1 = gpu(0, DCGM_FI_DEV_XID_ERRORS=79), gpu(1)
    g0.pods = [("ml", "a", "c"), ("ml", "b", "c")]
    src = _source(tmp_path)
    assert _xids(src, render([g0, g1])) == []  # a days-old 79: the baseline
    assert src.counters.value(DCGM_XID_BASELINES) == 1
    g1.values["DCGM_FI_DEV_XID_ERRORS"] = 48
    assert _xids(src, render([g0, g1])) == [(48, g1.uuid)]
    src.save_state()  # what run() does after each scrape that worked

    restarted = _source(tmp_path)
    assert _xids(restarted, render([g0, g1])) == []
    g0.values["DCGM_FI_DEV_XID_ERRORS"] = 13
    assert _xids(restarted, render([g0, g1])) == [(13, g0.uuid)]
    assert restarted.counters.value(DCGM_XIDS) == 1
    assert restarted.counters.value(DCGM_XID_BASELINES) == 0


def test_mig_instances_report_their_own_xids_once(tmp_path: Path) -> None:
    g = gpu(0)
    g.instances = [Instance(1, "3g.40gb"), Instance(2, "4g.40gb")]
    src = _source(tmp_path)
    assert _xids(src, render([g])) == []
    g.instances[0].values["DCGM_FI_DEV_XID_ERRORS"] = 43  # only instance 1 saw it
    assert _xids(src, render([g])) == [(43, g.uuid)]
    g.values["DCGM_FI_DEV_XID_ERRORS"] = 79  # the GPU and both instances: one XID
    g.instances[0].values["DCGM_FI_DEV_XID_ERRORS"] = 79
    assert _xids(src, render([g])) == [(79, g.uuid)]
    assert src.counters.value(DCGM_XIDS) == 2
