"""A shard owner's address from its EndpointSlice (pure; the slice read and the HTTP request
against the real API server and real replicas: tests/integration/test_shard_reads.py)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuhealth.controller.leadership.endpoint import endpoint_slice
from gpuhealth.controller.shards.peers import owner_address


def published(ip: str, port: int = 8443, name: str = "http") -> dict[str, Any]:
    return endpoint_slice(
        namespace="ns",
        service="ctl-shard-1",
        service_uid="u",
        pod_name="ctl-0",
        pod_ip=ip,
        port=port,
        port_name=name,
    )


@pytest.mark.parametrize(
    ("body", "address"),
    [
        pytest.param(published("10.0.0.7"), "10.0.0.7:8443", id="what-LeaderEndpoint-writes"),
        pytest.param(published("fd00::7", 9000), "[fd00::7]:9000", id="ipv6-bracketed"),
        pytest.param({**published("10.0.0.7"), "endpoints": []}, None, id="withdrawn"),
        pytest.param(published("10.0.0.7", name="metrics"), None, id="no-port-of-that-name"),
        pytest.param(
            {
                **published("10.0.0.7"),
                "endpoints": [
                    {"addresses": ["10.0.0.8"], "conditions": {"ready": False}},
                    {"addresses": ["not-an-ip", "10.0.0.9"]},
                ],
            },
            "10.0.0.9:8443",
            id="not-ready-and-garbage-skipped",
        ),
        pytest.param({"ports": [{"name": "http", "port": "x"}]}, None, id="bad-port"),
        pytest.param({}, None, id="empty"),
    ],
)
def test_owner_address(body: dict[str, Any], address: str | None) -> None:
    assert owner_address(body, "http") == address
