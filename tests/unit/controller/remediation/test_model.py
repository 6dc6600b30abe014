"""The CRD shipped in the chart and the model the controller writes agree field by field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from gpuhealth.controller.remediation.model import (
    API_VERSION,
    KIND,
    PLURAL,
    Phase,
    Spec,
    Status,
)

CRD = (
    Path(__file__).resolve().parents[4]
    / "deploy/helm/gpuhealth/files/crds/gpuremediations.gpuhealth.io.yaml"
)


def crd() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(CRD.read_text())
    return doc


def version() -> dict[str, Any]:
    (v,) = crd()["spec"]["versions"]
    return v  # type: ignore[no-any-return]


def schema() -> dict[str, Any]:
    return version()["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


def resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        return resolve(defs[node["$ref"].split("/")[-1]], defs)
    if "anyOf" in node:
        (real,) = [n for n in node["anyOf"] if n.get("type") != "null"]
        return resolve(real, defs)
    return node


def compare(model: dict[str, Any], kube: dict[str, Any], defs: dict[str, Any], path: str) -> None:
    model = resolve(model, defs)
    if "enum" in model:
        assert kube["type"] == "string" and set(kube["enum"]) == set(model["enum"]), path
        return
    assert kube["type"] == model["type"], f"{path}: {kube['type']} != {model['type']}"
    if model["type"] == "string" and model.get("format") == "date-time":
        assert kube.get("format") == "date-time", path
    if model["type"] == "array":
        compare(model["items"], kube["items"], defs, path + "[]")
        assert "maxItems" in kube, f"{path}: unbounded list"
    if model["type"] == "object" and "properties" in model:
        assert set(kube["properties"]) == set(model["properties"]), path
        assert set(kube.get("required", [])) <= set(model.get("required", [])), path
        for name, sub in model["properties"].items():
            compare(sub, kube["properties"][name], defs, f"{path}.{name}")
    if kube["type"] == "string" and "enum" not in kube and kube.get("format") != "date-time":
        assert "maxLength" in kube or "pattern" in kube, f"{path}: unbounded string"


@pytest.mark.parametrize(("part", "cls"), [("spec", Spec), ("status", Status)])
def test_schema_matches_the_model(part: str, cls: type) -> None:
    ms = msgspec.json.schema(cls)
    defs = ms["$defs"]
    compare(ms, schema()["properties"][part], defs, part)


def test_identity_and_operator_view() -> None:
    doc = crd()
    assert f"{doc['spec']['group']}/{version()['name']}" == API_VERSION
    assert doc["spec"]["names"]["kind"] == KIND and doc["spec"]["names"]["plural"] == PLURAL
    assert doc["spec"]["scope"] == "Cluster"
    assert version()["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version()["additionalPrinterColumns"]}
    assert columns["Node"] == ".spec.nodeName" and columns["Phase"] == ".status.phase"
    assert columns["Action"] == ".spec.action" and columns["Age"] == ".metadata.creationTimestamp"
    assert set(schema()["properties"]["status"]["properties"]["phase"]["enum"]) == {
        p.value for p in Phase
    }
    rules = schema()["properties"]["spec"]["x-kubernetes-validations"]
    assert {"rule": "self == oldSelf", "message": "spec is immutable"} in rules
    assert doc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
