"""The fast sample reader agrees with prometheus_client's parser, and fails only ValueError."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from gpuhealth.agent.sources.dcgm.fields import FIELDS
from gpuhealth.agent.sources.dcgm.prom_text import iter_samples
from tests.support.dcgm_exposition import Instance, gpu, render


def _reference(text: str, wanted: set[str]) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            name = s.name
            if fam.type == "counter" and name == fam.name + "_total":
                name = fam.name  # prometheus_client names counter samples <family>_total
            if name in wanted:
                out.append((name, dict(s.labels), float(s.value)))
    return out


def _ours(text: str, wanted: set[str]) -> list[tuple[str, dict[str, str], float]]:
    return list(iter_samples(text, wanted))


def _fixtures() -> list[str]:
    shared = gpu(0, DCGM_FI_DEV_XID_ERRORS=79)
    shared.pods = [("ml", "a", "main"), ("ml", "b", "main")]
    mig = gpu(1)
    mig.instances = [Instance(1, "3g.40gb", {"DCGM_FI_DEV_FB_USED": 10})]
    return [
        render([shared, mig]),
        render([shared, mig], old_namespace=True, hostname="hostname"),
        render([gpu(2)], fields=["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE"]),
    ]


@pytest.mark.parametrize("text", _fixtures())
def test_agrees_with_prometheus_client_on_dcgm_exporter_text(text: str) -> None:
    wanted = set(FIELDS)
    assert _ours(text, wanted) == _reference(text, wanted)
    assert len(_ours(text, wanted)) >= 2


@pytest.mark.parametrize(
    ("line", "want"),
    [
        ('m{a="b"} 1', ("m", {"a": "b"}, 1.0)),
        ('m{a="b",} 1', ("m", {"a": "b"}, 1.0)),  # trailing comma
        ("m{} 2", ("m", {}, 2.0)),
        ("m 3 1700000000000", ("m", {}, 3.0)),  # with a timestamp
        ('m { a = "x" , b="y" } 4', ("m", {"a": "x", "b": "y"}, 4.0)),
        ('m{a="q\\"uote\\\\back\\nline"} 5', ("m", {"a": 'q"uote\\back\nline'}, 5.0)),
        ('m{a="{,}"} +Inf', ("m", {"a": "{,}"}, math.inf)),
        ("m -1.5e3", ("m", {}, -1500.0)),
    ],
)
def test_sample_shapes(line: str, want: tuple[str, dict[str, str], float]) -> None:
    assert _ours(line + "\n", {"m"}) == [want]


@pytest.mark.parametrize(
    "line",
    [
        'm{a="b" 1',  # unclosed
        "m{a=b} 1",  # unquoted
        'm{a="b"}1',  # no space before the value
        "m",  # no value
        "m 1 2 3",
        "m 1_000",
        "m one",
        "m 1 1.5",  # timestamp must be an integer
        '{a="b"} 1',  # no name
    ],
)
def test_malformed_wanted_lines_are_value_errors(line: str) -> None:
    with pytest.raises(ValueError, match="line 2"):
        _ours("# HELP m x\n" + line + "\n", {"m"})


def test_other_names_and_comments_are_skipped() -> None:
    text = '# TYPE m gauge\nother{broken 1\n\n   \nm{a="b"} 1\n'
    assert _ours(text, {"m"}) == [("m", {"a": "b"}, 1.0)]


label_values = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20
)
# Names starting with "__" are reserved for Prometheus' own use and refused by
# prometheus_client; dcgm-exporter never writes them.
label_names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,8}", fullmatch=True).filter(
    lambda name: not name.startswith("__")
)
values = st.one_of(
    st.integers(min_value=-(2**53), max_value=2**53).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(["NaN", "+Inf", "-Inf", "1e300"]),
)


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.dictionaries(label_names, label_values, max_size=5), values),
        min_size=1,
        max_size=5,
    )
)
def test_agrees_with_prometheus_client_on_any_valid_line(
    rows: list[tuple[dict[str, str], str]],
) -> None:
    text = "# TYPE m gauge\n" + "".join(
        "m{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "} " + value + "\n"
        for labels, value in rows
    )
    ours, ref = _ours(text, {"m"}), _reference(text, {"m"})
    assert [(n, lab) for n, lab, _ in ours] == [(n, lab) for n, lab, _ in ref]
    for (_, _, a), (_, _, b) in zip(ours, ref, strict=True):
        assert a == b or (math.isnan(a) and math.isnan(b))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_any_text_yields_or_is_a_value_error(text: str) -> None:
    try:
        for name, labels, value in iter_samples(text, {"m", "DCGM_FI_DEV_GPU_TEMP"}):
            assert isinstance(name, str) and isinstance(labels, dict)
            assert isinstance(value, float)
    except ValueError:
        pass


def test_a_repeated_label_block_is_parsed_once_but_handed_out_apart() -> None:
    text = 'm{a="1",b="x\\"y"} 1\nm{a="1",b="x\\"y"} 2\n'
    (_, first, _), (_, second, v) = _ours(text, {"m"})
    assert first == second == {"a": "1", "b": 'x"y'} and v == 2.0
    first["a"] = "changed"
    assert second["a"] == "1"
