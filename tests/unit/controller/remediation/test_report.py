"""Episode rows for the status CLI and JSON for the status page; order messages on the wire."""

from __future__ import annotations

from datetime import timedelta

from gpuhealth.controller.remediation.actions import OrderRequest
from gpuhealth.controller.remediation.model import Phase
from gpuhealth.controller.remediation.report import pipeline, rows, table, to_json
from gpuhealth.controller.remediation.wire import order_message
from gpuhealth.protocol.remediation import (
    CancelOrder,
    RebootOrder,
    ResetGpuOrder,
    ValidateOrder,
    decode_order,
    encode,
)
from tests.fakes.remediation_world import T0, World, fault_condition, node_facts
from tests.support.remediation import drive, finished, one_round, runner_for, settings


async def test_rows_table_json_and_pipeline() -> None:
    w = World()
    w.nodes["node-a"] = node_facts(
        "node-a", unhealthy={0: fault_condition("xid-48", "RESET_GPU")}, allocations=None
    )
    w.nodes["node-b"] = node_facts(
        "node-b", unhealthy={0: fault_condition("row-remap-failure", "CONTACT_SUPPORT")}
    )
    r = runner_for(w, settings())
    await drive(
        w,
        r,
        lambda: any(e.node == "node-a" and e.status.times.returned for e in w.store.episodes()),
    )
    await one_round(w, r)
    now = w.clock.now() + timedelta(minutes=3)
    got = rows(w.store.episodes(), now)
    assert [row[1:4] for row in got] == [
        ("node-b", "Escalated", "escalate"),
        ("node-a", "Returned", "reset-gpu"),
    ]
    assert got[0][5] == "3m" or got[0][5].endswith("s") or got[0][5].endswith("m")
    text = table(w.store.episodes(), now)
    assert text.splitlines()[0].split()[:4] == ["EPISODE", "NODE", "PHASE", "ACTION"]
    doc = to_json(w.store.episodes())
    assert doc[1]["spec"]["nodeName"] == "node-a" and doc[1]["status"]["phase"] == "Returned"
    counts = pipeline(w.store.episodes())
    assert (
        counts["Escalated"] == 1
        and counts["Returned"] == 1
        and set(counts) == {p.value for p in Phase}
    )
    assert finished


def test_every_order_kind_becomes_a_valid_message() -> None:
    reqs = [
        OrderRequest(
            kind="reset-gpu",
            order_id="0123456789abcdef-reset-gpu-1",
            deadline_s=60,
            gpus=("GPU-1",),
        ),
        OrderRequest(
            kind="reboot",
            order_id="0123456789abcdef-reboot-1",
            deadline_s=60,
            expected_boot_id="b",
            reason="r",
        ),
        OrderRequest(
            kind="validate",
            order_id="0123456789abcdef-validate-1",
            deadline_s=600,
            gpus=("GPU-1",),
            signals=("xid-48",),
            soak_s=30,
            diagnostic=True,
        ),
        OrderRequest(
            kind="cancel",
            order_id="0123456789abcdef-validate-1-cancel",
            deadline_s=60,
            cancel_order_id="0123456789abcdef-validate-1",
        ),
    ]
    kinds = [ResetGpuOrder, RebootOrder, ValidateOrder, CancelOrder]
    for seq, (req, kind) in enumerate(zip(reqs, kinds, strict=True), start=1):
        msg = order_message(req, seq=seq, episode="node-a-0123456789abcdef", now=T0)
        assert isinstance(msg, kind) and msg.seq == seq
        assert decode_order(encode(msg)) == msg  # within every bound of the protocol
