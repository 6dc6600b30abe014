"""The real agent process scraping a dcgm-exporter stand-in over HTTP, across restarts.

The stand-in serves text of dcgm-exporter's exact shape (tests/support/dcgm_exposition.py) on
127.0.0.1; the agent runs as `gpuhealth-agent --source dcgm-exporter` with a state dir that
outlives it. Checked through the agent's /metrics: a days-old XID at start is a baseline, a
change is one XID, a restart re-reports nothing, an XID that arrived while the agent was
down is reported once, a GPU shared by four pods keeps its own NVLink error count, and the
stock counters leave rules blind.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.agent_process import agent_cmd, free_port
from tests.support.dcgm_exposition import gpu, render
from tests.support.wait import until_sync

pytestmark = pytest.mark.integration

PODS = [("ml", f"train-{i}", "main") for i in range(4)]
STOCK = [  # dcgm-exporter's default-counters.csv, the fields it does not comment out
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
]  # fmt: skip


class Exporter:
    """A dcgm-exporter stand-in: GET /metrics serves ``body``."""

    def __init__(self) -> None:
        self.body = ""
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                data = exporter.body.encode()
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def exporter() -> Iterator[Exporter]:
    exp = Exporter()
    yield exp
    exp.close()


class Agent:
    def __init__(self, tmp_path: Path, url: str, run: int) -> None:
        cfg = tmp_path / "agent.yaml"
        cfg.write_text("tick_interval_s: 0.05\ndcgm:\n  scrape_interval_s: 0.1\n")
        self.port = free_port()
        self.log = tmp_path / f"agent-{run}.log"
        with self.log.open("wb") as err:
            self.proc = subprocess.Popen(
                [
                    *agent_cmd(),
                    "--node-name=gpu-node-7",
                    "--source=dcgm-exporter",
                    f"--dcgm-exporter-url={url}",
                    "--kmsg-path=none",
                    f"--listen=127.0.0.1:{self.port}",
                    f"--state-dir={tmp_path / 'state'}",
                    f"--podresources-socket={tmp_path / 'kubelet.sock'}",
                    f"--config={cfg}",
                    "--log-format=json",
                ],
                stdout=subprocess.DEVNULL,
                stderr=err,
            )

    def metrics(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        if self.proc.poll() is not None:
            raise AssertionError(f"agent exited: {self.log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as r:
                text = r.read().decode()
        except OSError:
            return {}
        out: dict[str, list[tuple[dict[str, str], float]]] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out.setdefault(s.name, []).append((dict(s.labels), s.value))
        return out

    def value(self, name: str, **labels: str) -> float | None:
        found = [
            v
            for lab, v in self.metrics().get(name, [])
            if all(lab.get(k) == want for k, want in labels.items())
        ]
        return found[0] if found else None

    def scrapes_at_least(self, n: int) -> None:
        until_sync(
            lambda: (self.value("gpuhealth_agent_dcgm_scrapes_total") or 0) >= n,
            f"{n} dcgm-exporter scrapes",
            timeout_s=30,
            interval_s=0.05,
        )

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(15) == 0
        assert "Traceback" not in self.log.read_text()


@pytest.fixture
def agents() -> Iterator[list[Agent]]:
    started: list[Agent] = []
    yield started
    for a in started:
        if a.proc.poll() is None:
            a.proc.kill()
            a.proc.wait(10)


def test_xid_baseline_survives_restarts_and_shared_gpus_count_once(
    tmp_path: Path, exporter: Exporter, agents: list[Agent]
) -> None:
    shared = gpu(
        0,
        DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL=1,
        DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL=1,
        DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL=2,
        DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL=1,
    )
    shared.pods = PODS
    old_xid = gpu(1, DCGM_FI_DEV_XID_ERRORS=79)  # from days ago, before the agent started
    exporter.body = render([shared, old_xid])

    # 1. First start: the old XID 79 is the baseline; 4 pods x 5 NVLink errors are 5.
    a = Agent(tmp_path, exporter.url, 1)
    agents.append(a)
    a.scrapes_at_least(3)
    assert a.value("gpuhealth_gpu_nvlink_errors_total", gpu="0") == 5
    assert a.value("gpuhealth_agent_dcgm_xid_baselines_total") == 1
    assert a.value("gpuhealth_agent_dcgm_xids_total") == 0
    assert a.value("gpuhealth_gpu_xid_errors_total", gpu="1") is None
    assert a.value("gpuhealth_gpu_health_state", gpu="1", state="healthy") == 1
    assert (a.value("gpuhealth_agent_dcgm_series_copies_total") or 0) > 0
    assert a.value("gpuhealth_agent_rule_blind", rule="nvlink-errors") == 0
    assert a.value("gpuhealth_agent_rule_blind", rule="ecc-dbe") == 0

    # 2. A new XID: the value changes to 48.
    old_xid.values["DCGM_FI_DEV_XID_ERRORS"] = 48
    exporter.body = render([shared, old_xid])
    until_sync(
        lambda: a.value("gpuhealth_gpu_xid_errors_total", gpu="1", xid="48") == 1,
        "XID 48 on GPU 1",
        timeout_s=10,
        interval_s=0.05,
    )
    assert a.value("gpuhealth_gpu_health_state", gpu="1", state="unhealthy") == 1
    a.stop()

    # 3. Restart: 48 is still served; nothing is reported again (the verdict stays latched).
    b = Agent(tmp_path, exporter.url, 2)
    agents.append(b)
    b.scrapes_at_least(3)
    assert b.value("gpuhealth_agent_dcgm_xids_total") == 0
    assert b.value("gpuhealth_agent_dcgm_xid_baselines_total") == 0
    assert b.value("gpuhealth_gpu_xid_errors_total", gpu="1") is None
    assert b.value("gpuhealth_gpu_condition", gpu="1", code="xid-48") == 1
    b.stop()

    # 4. An XID while the agent is down, and the stock counters: reported once, rules blind.
    shared.values["DCGM_FI_DEV_XID_ERRORS"] = 79
    exporter.body = render([shared, old_xid], fields=STOCK)
    c = Agent(tmp_path, exporter.url, 3)
    agents.append(c)
    c.scrapes_at_least(3)
    assert c.value("gpuhealth_agent_dcgm_xids_total") == 1
    assert c.value("gpuhealth_gpu_xid_errors_total", gpu="0", xid="79") == 1
    assert c.value("gpuhealth_gpu_xid_errors_total", gpu="1") is None
    for rule in ("ecc-dbe", "ecc-sbe-rate", "nvlink-errors", "row-remap-pending"):
        assert c.value("gpuhealth_agent_rule_blind", source="dcgm", rule=rule) == 1, rule
    assert c.value("gpuhealth_agent_rule_blind", source="dcgm", rule="xid") == 0
    c.stop()
    log = c.log.read_text()
    assert '"event": "dcgm_rules_blind"' in log and "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL" in log
