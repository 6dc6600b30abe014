"""``gpuhealth-controller --tls-cert-file/--tls-key-file`` serves HTTPS that agents can verify;
the chart's generated certificate, served by the real controller, is verified by a real agent
process, and an agent with another CA or another name is refused."""

from __future__ import annotations

import asyncio
import base64
import os
import ssl
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
import yaml

from demo.cluster import agent_tokens, write_tokens
from localkube import ControlPlane
from localkube.process import free_port
from tests.integration.test_helm import helm, render
from tests.support.wait import until

pytestmark = pytest.mark.integration

__all__ = ["helm"]  # the fixture, shared with test_helm.py


async def test_controller_serves_https_with_the_given_certificate(
    control_plane: ControlPlane, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "tls.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "tls.key"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "tls.crt"))
    cfg = tmp_path / "controller.yaml"
    cfg.write_text(f"leader:\n  namespace: default\n  lease_name: {unique_name('tls')}\n")
    port = free_port()
    log = (tmp_path / "controller.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "gpuhealth.controller.cli",
            "--kubeconfig", str(control_plane.kubeconfig),
            "--listen", f"127.0.0.1:{port}",
            "--config", str(cfg),
            "--tls-cert-file", str(tmp_path / "tls.crt"),
            "--tls-key-file", str(tmp_path / "tls.key"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
        env={**os.environ, "PYTHONPATH": str(Path.cwd())},
    )  # fmt: skip
    trusted = ssl.create_default_context()
    ca.configure_trust(trusted)
    try:
        async with aiohttp.ClientSession() as s:

            async def healthy() -> bool | None:
                try:
                    async with s.get(f"https://127.0.0.1:{port}/healthz", ssl=trusted) as r:
                        return True if r.status == 200 else None
                except aiohttp.ClientConnectionError:
                    return None

            await until(healthy, "HTTPS /healthz 200", timeout_s=30)
            # A client that does not trust the CA is refused: agents verify the controller.
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                async with s.get(
                    f"https://127.0.0.1:{port}/healthz", ssl=ssl.create_default_context()
                ):
                    pass
            # Plain HTTP on the TLS port does not get an answer.
            with pytest.raises(aiohttp.ClientError):
                async with s.get(f"http://127.0.0.1:{port}/healthz") as r:
                    await r.read()
    finally:
        proc.terminate()
        assert proc.wait(timeout=20) == 0, (tmp_path / "controller.log").read_text()[-3000:]
        log.close()


def test_certificate_without_key_is_a_config_error(tmp_path: Path) -> None:
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    out = subprocess.run(
        [sys.executable, "-m", "gpuhealth.controller.cli", "--tls-cert-file", str(cert)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path.cwd())},
        check=False,
    )
    assert out.returncode == 2
    assert "--tls-cert-file and --tls-key-file must be given together" in out.stderr


# ------------------------------------------- the chart's generated certificate, end to end

CONTROLLER_HOST = "gpuhealth-controller.gpuhealth.svc"
"""The controller Service's DNS name for release gpuhealth in namespace gpuhealth (the names
demo.cluster.agent_tokens gives the agents' ServiceAccount)."""

RESOLVE_SHIM = f"""
import socket
_getaddrinfo = socket.getaddrinfo
def _resolve(host, *args, **kwargs):
    return _getaddrinfo("127.0.0.1" if host == {CONTROLLER_HOST!r} else host, *args, **kwargs)
socket.getaddrinfo = _resolve
"""
"""A sitecustomize for the agent process: the Service's name resolves to 127.0.0.1, as the
cluster DNS would resolve it to the Service. TLS still checks the certificate against the
name in the URL."""


def _by(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


@dataclass
class ChartTls:
    """What the chart's default render hands the controller and the agents."""

    cert: Path
    key: Path
    ca: Path
    controller_url: str
    config: dict[str, Any]


@pytest.fixture
def chart_tls(helm: str, tmp_path: Path) -> ChartTls:
    docs = render(helm, tmp_path, {})
    secret = _by(docs, "Secret", "gpuhealth-controller-tls")["data"]
    ca = _by(docs, "ConfigMap", "gpuhealth-controller-ca")["data"]["ca.crt"]
    assert base64.b64decode(secret["ca.crt"]).decode() == ca
    (agent,) = [d for d in docs if d["kind"] == "DaemonSet"]
    args = agent["spec"]["template"]["spec"]["containers"][0]["args"]
    (url,) = [a.split("=", 1)[1] for a in args if a.startswith("--controller-url=")]
    assert "--controller-ca-file=/etc/gpuhealth/controller-ca/ca.crt" in args
    config = yaml.safe_load(
        _by(docs, "ConfigMap", "gpuhealth-controller")["data"]["controller.yaml"]
    )
    out = ChartTls(tmp_path / "tls.crt", tmp_path / "tls.key", tmp_path / "ca.crt", url, config)
    out.cert.write_bytes(base64.b64decode(secret["tls.crt"]))
    out.key.write_bytes(base64.b64decode(secret["tls.key"]))
    out.ca.write_text(ca)
    return out


async def test_an_agent_verifies_the_charts_generated_certificate_and_refuses_others(
    control_plane: ControlPlane,
    api_client: Any,
    chart_tls: ChartTls,
    unique_name: Callable[[str], str],
    tmp_path: Path,
) -> None:
    """The chart's default (generated CA, certificate for the Service's name) served by the
    real controller: an agent with the chart's CA connects to wss://<Service name> and is
    admitted; an agent with another CA, or dialling an address the certificate does not name,
    is refused before it sends its token."""
    assert chart_tls.controller_url == f"wss://{CONTROLLER_HOST}:8080/v1/stream"
    good, wrong_ca, wrong_name = (unique_name(n) for n in ("tls-good", "tls-ca", "tls-name"))
    tokens = write_tokens(
        await agent_tokens(api_client, [good, wrong_ca, wrong_name]), tmp_path / "tokens"
    )
    port = free_port()
    config = {
        **chart_tls.config,
        "kubeconfig": str(control_plane.kubeconfig),
        "listen": f"127.0.0.1:{port}",
        "leader": {"namespace": "default", "lease_name": unique_name("tls"), "service": ""},
        "remediation": {"enabled": True},  # orders over TLS: allowed without a test switch
    }
    (tmp_path / "controller.yaml").write_text(yaml.safe_dump(config))
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(RESOLVE_SHIM)
    other_ca = tmp_path / "other-ca.crt"
    trustme.CA().cert_pem.write_to_path(str(other_ca))
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(name: str, argv: list[str], pythonpath: str) -> tuple[subprocess.Popen[bytes], Path]:
        log = tmp_path / f"{name}.log"
        with log.open("w") as out:
            procs[name] = subprocess.Popen(
                [sys.executable, *argv],
                stdout=subprocess.DEVNULL,
                stderr=out,
                env={**os.environ, "PYTHONPATH": pythonpath},
            )
        return procs[name], log

    repo = str(Path.cwd())
    start("controller", ["-m", "gpuhealth.controller.cli", "--config",
          str(tmp_path / "controller.yaml"), "--tls-cert-file", str(chart_tls.cert),
          "--tls-key-file", str(chart_tls.key)], repo)  # fmt: skip
    agents: dict[str, tuple[int, Path]] = {}
    for node, url, ca in (
        (good, f"wss://{CONTROLLER_HOST}:{port}/v1/stream", chart_tls.ca),
        (wrong_ca, f"wss://{CONTROLLER_HOST}:{port}/v1/stream", other_ca),
        (wrong_name, f"wss://127.0.0.1:{port}/v1/stream", chart_tls.ca),
    ):
        (tmp_path / f"{node}.yaml").write_text(yaml.safe_dump(SCENARIO))
        metrics = free_port()
        _, log = start(node, ["-m", "gpuhealth.agent.cli", "--node-name", node,
              "--source", "sim", "--sim-scenario", str(tmp_path / f"{node}.yaml"),
              "--kmsg-path", "none", "--listen", f"127.0.0.1:{metrics}",
              "--controller-url", url, "--controller-ca-file", str(ca),
              "--token-file", str(tokens[node]), "--state-dir", str(tmp_path / f"state-{node}"),
              "--podresources-socket", "none"], f"{shim}:{repo}")  # fmt: skip
        agents[node] = (metrics, log)
    try:
        async with aiohttp.ClientSession() as s:

            async def connected(node: str) -> bool | None:
                try:
                    async with s.get(f"http://127.0.0.1:{agents[node][0]}/metrics") as r:
                        text = await r.text()
                except aiohttp.ClientConnectionError:
                    return None
                return True if "gpuhealth_agent_stream_connected 1.0" in text else None

            await until(
                lambda: connected(good), "the agent with the chart's CA admitted", timeout_s=60
            )

            def refused(node: str) -> bool | None:
                log = agents[node][1].read_text()
                return True if "CERTIFICATE_VERIFY_FAILED" in log else None

            await until(lambda: refused(wrong_ca), "the other CA refused", timeout_s=30)
            await until(lambda: refused(wrong_name), "the wrong name refused", timeout_s=30)
            assert "IP address mismatch" in agents[wrong_name][1].read_text()
            assert not await connected(wrong_ca) and not await connected(wrong_name)
    finally:
        for p in procs.values():
            p.terminate()
        for name, p in procs.items():
            assert p.wait(timeout=20) in (0, -15), (tmp_path / f"{name}.log").read_text()[-3000:]


SCENARIO: dict[str, Any] = {"name": "tls", "gpus": 1, "seed": 7, "faults": []}


# --------------------------------------------- the certificate the controller keeps itself


async def test_the_kept_certificate_is_made_once_renewed_in_time_and_rotated_by_deleting_it(
    api_client: Any, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    """Against the real API server (controller/http/certificates.py): two replicas starting
    at once create one certificate between them (the loser of the create takes the winner's)
    and publish its CA alone; near its end one renews it with the same CA and the other
    adopts the renewal (agents need nothing new); deleting the Secret rotates: a new CA,
    published. A certificate mounted from elsewhere (cert-manager's, the user's Secret) has
    its CA published too."""
    import datetime as dt

    from gpuhealth.controller.http.certificates import CertificateKeeper
    from gpuhealth.controller.http.settings import TlsSettings
    from gpuhealth.controller.kube.rest import request
    from localkube.objects import create_namespace
    from tests.support.clock import FakeClock

    ns = unique_name("keep")
    await create_namespace(api_client, ns)
    clock = FakeClock(start=dt.datetime.now(dt.UTC))
    settings = TlsSettings(
        secret="kept",
        ca_configmap="kept-ca",
        names=(f"ctl.{ns}.svc", "localhost"),
        validity_days=10,
        renew_before_days=2,
    )

    def keeper(name: str, s: TlsSettings = settings) -> CertificateKeeper:
        (tmp_path / name).mkdir()
        return CertificateKeeper(
            s,
            api_client,
            ns,
            cert_file=str(tmp_path / name / "tls.crt"),
            key_file=str(tmp_path / name / "tls.key"),
            clock=clock,
        )

    async def published() -> str:
        cm = await request(api_client, "GET", f"/api/v1/namespaces/{ns}/configmaps/kept-ca")
        assert set(cm["data"]) == {"ca.crt"}
        return str(cm["data"]["ca.crt"])

    a, b = keeper("a"), keeper("b")
    await asyncio.gather(a.start(), b.start())
    assert a.created + b.created == 1  # one certificate between the two
    assert a.kept == b.kept and a.kept is not None
    first = a.kept
    assert (tmp_path / "a" / "tls.crt").read_bytes() == (tmp_path / "b" / "tls.crt").read_bytes()
    assert await published() == first.ca.cert.decode()

    clock.advance(9 * 86400)  # within renew_before_days of its end
    renewed = await a.ensure()
    assert a.renewed == 1 and renewed.ca == first.ca and renewed.serving != first.serving
    assert await b.ensure() == renewed and b.renewed == 0  # adopted, not renewed twice
    assert (tmp_path / "b" / "tls.crt").read_bytes() == renewed.serving.cert
    await b.publish()
    assert await published() == first.ca.cert.decode()  # the same CA: agents untouched

    created = a.created + b.created
    await request(api_client, "DELETE", f"/api/v1/namespaces/{ns}/secrets/kept")
    rotated = await a.ensure()
    assert rotated.ca != first.ca and a.created + b.created == created + 1
    await a.publish()
    assert await published() == rotated.ca.cert.decode()

    # cert-manager's or your Secret, mounted: its ca.crt published for the agents
    mounted = tmp_path / "mounted-ca.crt"
    mounted.write_bytes(first.ca.cert)
    elsewhere = keeper("c", TlsSettings(ca_configmap="kept-ca", ca_file=str(mounted)))
    await elsewhere.start()
    assert await published() == first.ca.cert.decode()
    await request(api_client, "DELETE", f"/api/v1/namespaces/{ns}")
