"""The settings convention (common/config.py) for every section of agent and controller, and
the loader: errors name file, line and field; any input is a config or a ConfigError."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuhealth.agent.settings import AgentSettings
from gpuhealth.agent.settings import load_config as load_agent
from gpuhealth.common.config import SettingError, Settings, check_all, load_settings
from gpuhealth.common.errors import ConfigError
from gpuhealth.controller.settings import ControllerSettings
from gpuhealth.controller.settings import load_config as load_controller

LOADERS = {"agent": load_agent, "controller": load_controller}
ROOTS: dict[str, type[Settings]] = {"agent": AgentSettings, "controller": ControllerSettings}


def _sections(root: type[msgspec.Struct]) -> dict[str, type[msgspec.Struct]]:
    """Every struct reachable from ``root``: field path -> type."""
    out: dict[str, type[msgspec.Struct]] = {"$": root}

    def walk(info: Any, path: str) -> None:
        if isinstance(info, msgspec.inspect.StructType):
            out[path] = info.cls
            for f in info.fields:
                walk(f.type, f"{path}.{f.name}")
        elif isinstance(info, msgspec.inspect.UnionType):
            for t in info.types:
                walk(t, path)
        elif isinstance(info, msgspec.inspect.DictType):
            walk(info.value_type, f"{path}.<key>")
        elif isinstance(info, msgspec.inspect.ListType | msgspec.inspect.SetType):
            walk(info.item_type, f"{path}[]")

    walk(msgspec.inspect.type_info(root), "$")
    return out


ALL_SECTIONS = [
    (component, path, cls)
    for component, root in ROOTS.items()
    for path, cls in _sections(root).items()
]


def test_every_section_is_found() -> None:
    paths = {f"{c}:{p}" for c, p, _ in ALL_SECTIONS}
    for want in (
        "agent:$.health",
        "agent:$.nvml",
        "agent:$.kmsg",
        "agent:$.dcgm",
        "agent:$.podresources",
        "agent:$.stream",
        "agent:$.stream.outbox",
        "agent:$.stream.backoff",
        "controller:$.policy",
        "controller:$.fleet",
        "controller:$.breaker",
        "controller:$.reconciler",
        "controller:$.watch",
        "controller:$.leader",
        "controller:$.dra",
        "controller:$.stream",
        "controller:$.extender",
        "controller:$.idle",
        "controller:$.idle.namespaces.<key>",
    ):
        assert want in paths


@pytest.mark.parametrize(("component", "path", "cls"), ALL_SECTIONS, ids=str)
def test_every_section_follows_the_convention(
    component: str, path: str, cls: type[msgspec.Struct]
) -> None:
    assert issubclass(cls, Settings), f"{component} {path}: {cls.__name__} is not a Settings"
    config = cls.__struct_config__
    assert config.forbid_unknown_fields and config.frozen
    with pytest.raises(TypeError):  # keyword-only: positional arguments are refused
        cls(0)


def _numbers_without_bounds(cls: type[msgspec.Struct]) -> list[str]:
    out = []
    info = msgspec.inspect.type_info(cls)
    assert isinstance(info, msgspec.inspect.StructType)
    for f in info.fields:
        types = f.type.types if isinstance(f.type, msgspec.inspect.UnionType) else (f.type,)
        for t in types:
            if isinstance(t, msgspec.inspect.IntType | msgspec.inspect.FloatType) and all(
                getattr(t, b) is None for b in ("ge", "gt", "le", "lt")
            ):
                out.append(f.name)
    return out


@pytest.mark.parametrize(("component", "path", "cls"), ALL_SECTIONS, ids=str)
def test_every_number_has_bounds(component: str, path: str, cls: type[msgspec.Struct]) -> None:
    assert _numbers_without_bounds(cls) == [], f"{component} {path}"


def _write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "config.yaml"
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize(
    ("component", "text", "where"),
    [
        # sections that once accepted unknown keys
        ("agent", "stream:\n  heartbeat_interval_s: 5\n  hartbeat: 1\n", ":3: $.stream.hartbeat"),
        ("agent", "stream:\n  outbox:\n    max_mesages: 5\n", ":3: $.stream.outbox.max_mesages"),
        ("agent", "podresources:\n  sokcet: /x\n", ":2: $.podresources.sokcet"),
        ("controller", "stream:\n  hello_timeout: 3\n", ":2: $.stream.hello_timeout"),
        # bounds, checked at load
        ("agent", "nvml:\n  poll_interval_s: 0\n", ":2: $.nvml.poll_interval_s"),
        ("agent", "stream:\n  backoff:\n    jitter: 2\n", ":3: $.stream.backoff.jitter"),
        ("agent", "health:\n  throttle_reasons: [hw_termal]\n", ":2: $.health.throttle_reasons"),
        ("agent", "tick_interval_s: .inf\n", ":1: $.tick_interval_s"),
        ("controller", "stream:\n  heartbeat_ack_every: 0\n", ":2: $.stream.heartbeat_ack_every"),
        ("controller", "breaker:\n  max_fraction: 2\n", ":2: $.breaker.max_fraction"),
        (
            "controller",
            "idle:\n  namespaces:\n    a:\n      window_s: 5\n    b:\n      window_s: -1\n",
            ":6: $.idle.namespaces.b.window_s",
        ),
        ("controller", "extender:\n  unknown_node_score: 11\n", ":2: $.extender.unknown_node"),
        # rules between fields, checked by the loader, naming the field to fix
        (
            "agent",
            "stream:\n  heartbeat_interval_s: 60\n  ack_timeout_s: 30\n",
            ":3: $.stream.ack_timeout_s",
        ),
        (
            "agent",
            "health:\n  slowdown_temperature_c: 99\n",
            ":2: $.health.slowdown_temperature_c",
        ),
        ("agent", "stream:\n  url: ws://x/v1/stream\n", ":2: $.stream.url"),
        ("agent", "listen: nowhere\n", ":1: $.listen"),
        ("agent", "controller_url: http://x\n", ":1: $.controller_url"),
        (
            "controller",
            "leader:\n  lease_duration_s: 5\n  renew_deadline_s: 10\n",
            ":3: $.leader.renew_deadline_s",
        ),
        ("controller", "tls_cert_file: /c.pem\n", ": $.tls_key_file"),
        ("controller", "prefix: a/b\n", ":1: $.prefix"),
    ],
)
def test_errors_name_file_line_and_field(
    tmp_path: Path, component: str, text: str, where: str
) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        LOADERS[component](path, {"node_name": "n"} if component == "agent" else None)
    assert f"{path}{where}" in str(info.value)


def test_a_flag_is_reported_as_a_flag(tmp_path: Path) -> None:
    path = _write(tmp_path, "nvml:\n  poll_interval_s: 2\n")
    with pytest.raises(ConfigError) as info:
        load_agent(path, {"node_name": "n", "nvml": {"expected_gpus": -1}})
    assert str(info.value).startswith("flags: $.nvml.expected_gpus")


@pytest.mark.parametrize("key", ["\n", "a\rb", "\x1b[2J"])
def test_an_unprintable_key_is_escaped_in_a_one_line_error(tmp_path: Path, key: str) -> None:
    path = _write(tmp_path, yaml.safe_dump({"cleanup": {key: 1}}))
    with pytest.raises(ConfigError) as info:
        load_controller(path, None)
    message = str(info.value)
    assert message.isprintable()
    assert f"$.cleanup.{key.encode('unicode_escape').decode()}: " in message


def test_sections_defaults_pass_their_own_rules() -> None:
    check_all(AgentSettings())
    check_all(ControllerSettings())


class _Inner(Settings, frozen=True, kw_only=True):
    a: int = 1

    def check(self) -> None:
        if self.a == 2:
            raise SettingError("a", "must not be 2")


class _Outer(Settings, frozen=True, kw_only=True):
    inner: dict[str, _Inner] = msgspec.field(default_factory=dict)


def test_check_errors_carry_the_full_path() -> None:
    with pytest.raises(SettingError) as info:
        check_all(_Outer(inner={"x": _Inner(a=2)}))
    assert info.value.field == "$.inner.x.a"
    with pytest.raises(ConfigError, match=r"flags: \$\.inner\.x\.a: must not be 2"):
        load_settings(_Outer, None, {"inner": {"x": {"a": 2}}})


# -- fuzz: whatever the file holds, the loader returns a config or raises ConfigError --------

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=12)
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=12) | st.integers(), inner, max_size=3)
    ),
    max_leaves=10,
)


def _keys(component: str) -> st.SearchStrategy[str]:
    """Real field names (so the fuzz gets past the unknown-key check) and some typos."""
    names: set[str] = {"bogus"}
    for _, _path, cls in (s for s in ALL_SECTIONS if s[0] == component):
        names.update(cls.__struct_fields__)
    return st.sampled_from(sorted(names))


def _documents(component: str) -> st.SearchStrategy[Any]:
    keys = _keys(component)
    nested = st.recursive(
        _values, lambda inner: st.dictionaries(keys, inner, max_size=4), max_leaves=12
    )
    return st.dictionaries(keys, nested, max_size=5)


def _check_loads(component: str, path: str | None, overrides: Any) -> None:
    try:
        cfg = LOADERS[component](path, overrides)
    except ConfigError as exc:
        message = str(exc)
        assert "\n" not in message.strip() or "YAML" in message
        if path is not None:
            assert path in message or message.startswith("flags: ")
    else:
        assert isinstance(cfg, ROOTS[component])
        check_all(cfg)


@pytest.mark.parametrize("component", ["agent", "controller"])
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_mapping_is_a_config_or_a_config_error(
    tmp_path_factory: pytest.TempPathFactory, component: str, data: st.DataObject
) -> None:
    doc = data.draw(_documents(component))
    path = tmp_path_factory.mktemp("cfg") / "config.yaml"
    try:
        path.write_text(yaml.safe_dump(doc))
    except yaml.YAMLError:
        return
    _check_loads(component, str(path), None)
    _check_loads(component, None, doc)  # the same mapping given as flags


@pytest.mark.parametrize("component", ["agent", "controller"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(max_size=80))
def test_any_text_is_a_config_or_a_config_error(
    tmp_path_factory: pytest.TempPathFactory, component: str, text: str
) -> None:
    path = tmp_path_factory.mktemp("cfg") / "config.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    _check_loads(component, str(path), None)


@pytest.mark.parametrize(
    "text",
    [
        "a: &x [*x]\n",  # a recursive alias
        "health: " + "[" * 1100 + "]" * 1100 + "\n",  # nested deeper than the recursion limit
        "? [a]\n: 1\n",  # a non-string key
        "1: 2\n",
        "stream: !!binary aGVsbG8=\n",
        "tick_interval_s: 1e400\n",
    ],
)
@pytest.mark.parametrize("component", ["agent", "controller"])
def test_hostile_documents(tmp_path: Path, component: str, text: str) -> None:
    _check_loads(component, _write(tmp_path, text), None)


def test_undecodable_file(tmp_path: Path) -> None:
    p = tmp_path / "config.yaml"
    p.write_bytes(b"listen: \xff\xfe\n")
    with pytest.raises(ConfigError, match=r"config\.yaml"):
        load_agent(str(p))
