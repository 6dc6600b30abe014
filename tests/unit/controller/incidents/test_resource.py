"""The GPUIncident resource: the CRD shipped in the chart and the structs the controller writes
agree field by field (every list and string bounded); an incident survives the round trip
through its object exactly (what a successor adopts is what the leader decided); anything that
is not a valid GPUIncident is refused, never half-read."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.controller.incidents.lifecycle import (
    Lifecycle,
    ObservedLifecycle,
    OnCallAction,
    Seen,
)
from gpuhealth.controller.incidents.model import (
    BlameDecision,
    DomainDecision,
    Incident,
    OverrideDecision,
    Subjects,
)
from gpuhealth.controller.incidents.resource import (
    API_VERSION,
    KIND,
    MAX_NODES,
    PLURAL,
    IncidentSpec,
    IncidentStatus,
    InvalidIncident,
    labels_of,
    lifecycle_patch,
    lifecycle_wire,
    new_object,
    status_of,
    stored_incident,
)
from gpuhealth.controller.names import Keys
from gpuhealth.controller.taints.policy import Taint
from tests.unit.controller.remediation.test_model import compare

CRD = (
    Path(__file__).resolve().parents[4]
    / "deploy/helm/gpuhealth/files/crds/gpuincidents.gpuhealth.io.yaml"
)
T0 = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
K = Keys()


def crd() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(CRD.read_text())
    return doc


def version() -> dict[str, Any]:
    (v,) = crd()["spec"]["versions"]
    return v  # type: ignore[no-any-return]


def schema() -> dict[str, Any]:
    return version()["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(("part", "cls"), [("spec", IncidentSpec), ("status", IncidentStatus)])
def test_schema_matches_the_model(part: str, cls: type) -> None:
    ms = msgspec.json.schema(cls)
    compare(ms, schema()["properties"][part], ms["$defs"], part)


def test_identity_and_what_kubectl_shows() -> None:
    doc = crd()
    assert f"{doc['spec']['group']}/{version()['name']}" == API_VERSION
    assert doc["spec"]["names"]["kind"] == KIND and doc["spec"]["names"]["plural"] == PLURAL
    assert doc["spec"]["names"]["shortNames"] == ["gpuinc"]
    assert doc["spec"]["scope"] == "Cluster"
    assert version()["subresources"] == {"status": {}}
    columns = {c["name"]: c for c in version()["additionalPrinterColumns"]}
    shown = [c["name"] for c in version()["additionalPrinterColumns"] if "priority" not in c]
    assert shown == ["Kind", "State", "Decision", "Nodes", "Since", "Age"]
    assert columns["Nodes"]["jsonPath"] == ".status.nodeCount"
    assert columns["Since"]["jsonPath"] == ".status.openedAt"
    assert columns["Acknowledged"]["jsonPath"] == ".spec.lifecycle.acknowledged.by"
    assert doc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    lifecycle = schema()["properties"]["spec"]["properties"]["lifecycle"]["properties"]
    assert lifecycle["silenced"]["required"] == ["by", "at", "reason", "until"]
    assert schema()["required"] == ["spec"]


def domain_incident(**kw: Any) -> Incident:
    base: dict[str, Any] = dict(
        kind="domain",
        key="rack-1",
        subjects=Subjects(nodes=("t0", "t1", "t2"), domain="rack-1"),
        decision="domain taint",
        reason="fabric faults on 2 of 3 nodes",
        opened_at=T0,
        last_seen=T0 + timedelta(seconds=30),
        evidence={"nodes": 3, "faulty_nodes": 2},
        domain=DomainDecision(("t0", "t1", "t2"), ("t1", "t2"), True),
    )
    return Incident(**{**base, **kw})


def as_object(i: Incident, lifecycle: Lifecycle | None = None) -> dict[str, Any]:
    """The object the API server would hold after the controller's writes and on-call's."""
    lifecycle = lifecycle or Lifecycle()
    obj = new_object(i, K)
    obj["metadata"]["resourceVersion"] = "7"
    obj["status"] = msgspec.to_builtins(status_of(i))
    obj["spec"] = {"lifecycle": msgspec.to_builtins(lifecycle_wire(lifecycle))}
    return obj


ACK = OnCallAction("alice", T0 + timedelta(minutes=1), "on it")
SILENCE = OnCallAction("bob", T0 + timedelta(minutes=2), "swap", until=T0 + timedelta(hours=2))


@pytest.mark.parametrize(
    "incident",
    [
        domain_incident(),
        domain_incident(domain=DomainDecision(("t0",), (), False), decision="held"),
        Incident(
            kind="gpu",
            key="n1/GPU-1",
            subjects=Subjects(nodes=("n1",), gpus=("n1/GPU-1",)),
            decision="gpu blamed: unhealthy + diagnostic",
            reason="XID 31 under 3 jobs",
            opened_at=T0,
            last_seen=T0,
            xid_class="app-fault",
            blame=BlameDecision(T0, T0 + timedelta(days=1), "XID 31 under 3 jobs", 31),
        ),
        Incident(
            kind="override",
            key="n1/gpuhealth.io/unhealthy=xid-79:NoSchedule",
            subjects=Subjects(nodes=("n1",)),
            decision="taint not put back",
            reason="taint removed by hand",
            opened_at=T0,
            last_seen=T0,
            override=OverrideDecision(Taint("gpuhealth.io/unhealthy", "xid-79", "NoSchedule"), "k"),
        ),
        domain_incident(
            state="closed",
            closed_at=T0 + timedelta(hours=1),
            close_reason="resolved by carol: fixed",
            lifecycle=Lifecycle(acknowledged=ACK, silenced=SILENCE),
            observed=ObservedLifecycle(acknowledged=Seen(ACK.at, True, T0), silenced=None),
        ),
        Incident(
            kind="job",
            key="ml/Job/train",
            subjects=Subjects(nodes=("a", "b"), owner="ml/Job/train", pods=("ml/p0", "ml/p1")),
            decision="no taint",
            reason="XID 13 on 2 nodes",
            opened_at=T0,
            last_seen=T0,
            xid_class="app-fault",
        ),
    ],
    ids=["domain", "held", "gpu", "override", "closed+lifecycle", "job"],
)
def test_an_incident_survives_its_object_exactly(incident: Incident) -> None:
    obj = as_object(incident, incident.lifecycle)
    item = stored_incident(obj)
    assert item.name == incident.id and item.resource_version == "7"
    assert item.labels == labels_of(incident, K)
    assert item.incident() == incident


def test_lists_are_cut_to_the_schema_and_the_count_keeps_going() -> None:
    nodes = tuple(f"n{i}" for i in range(MAX_NODES + 5))
    i = domain_incident(subjects=Subjects(nodes=nodes, domain="rack-1"))
    st_ = status_of(i)
    assert len(st_.subjects.nodes) == MAX_NODES and st_.node_count == MAX_NODES + 5


def test_the_lifecycle_patch_is_one_action() -> None:
    assert lifecycle_patch("silenced", SILENCE) == {
        "spec": {
            "lifecycle": {
                "silenced": {
                    "by": "bob",
                    "at": "2026-11-26T12:02:00Z",
                    "reason": "swap",
                    "until": "2026-11-26T14:00:00Z",
                }
            }
        }
    }


def test_an_object_without_status_yet_holds_no_incident() -> None:
    obj = {"metadata": {"name": "domain-x", "resourceVersion": "1"}, "spec": {}}
    item = stored_incident(obj)
    assert item.status is None and item.incident() is None


@pytest.mark.parametrize(
    ("name", "change"),
    [
        ("a name that is not the id", lambda o: o["metadata"].update(name="domain-000000000000")),
        ("an unknown kind", lambda o: o["status"].update(kind="rack")),
        ("a state that is neither", lambda o: o["status"].update(state="maybe")),
        ("a silence without until", lambda o: o["spec"]["lifecycle"].update(
            silenced={"by": "x", "at": "2026-01-01T00:00:00Z", "reason": "r"})),
        ("an action without by", lambda o: o["spec"]["lifecycle"].update(
            acknowledged={"at": "2026-01-01T00:00:00Z", "reason": "r"})),
        ("evidence that is not a count", lambda o: o["status"].update(evidence={"n": "x"})),
    ],
)  # fmt: skip
def test_what_is_not_a_gpuincident_is_refused(name: str, change: Any) -> None:
    obj = as_object(domain_incident())
    change(obj)
    with pytest.raises(InvalidIncident):
        stored_incident(obj)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)


@given(
    st.fixed_dictionaries(
        {"metadata": st.fixed_dictionaries({"name": st.text(max_size=20)}), "spec": JSON},
        optional={"status": JSON},
    )
)
def test_any_object_is_a_gpuincident_or_refused(obj: dict[str, Any]) -> None:
    try:
        item = stored_incident(obj)
    except InvalidIncident:
        return
    incident = item.incident()
    assert incident is None or incident.id == item.name
