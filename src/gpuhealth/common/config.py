"""Settings: one convention for every section of agent and controller, and the one loader.

A section is a :class:`Settings` subclass: a frozen msgspec struct that rejects unknown keys
(a typo is an error, never a silently ignored key). Every number carries its bounds in its
type (``Annotated[float, Meta(gt=0)]``, or one of the aliases below), so msgspec checks them
while the file is read. Rules between fields (``renew_deadline_s < lease_duration_s``) live in
the section's :meth:`Settings.check`, which :func:`load_settings` calls on every section after
the bounds; it raises :class:`SettingError` naming the field.

Every error is a :class:`~gpuhealth.common.errors.ConfigError` naming the file, the line (when
it can be found) and the field, e.g. ``/etc/gpuhealth/agent.yaml:4: $.health.clean_window_s:
Expected `float`, got `str```; a value given as a command-line flag is reported as ``flags``.
See docs/architecture.md "Settings".
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar

import msgspec
import yaml
from msgspec import Meta

from gpuhealth.common.errors import ConfigError

MAX_SECONDS = 30 * 24 * 3600.0
"""Upper bound of every duration setting (30 days): larger values are typos, and an infinite
timeout is a hang."""

Seconds = Annotated[float, Meta(ge=0.0, le=MAX_SECONDS)]
"""A duration that may be 0 (0 usually disables what it times)."""
PositiveSeconds = Annotated[float, Meta(gt=0.0, le=MAX_SECONDS)]
"""A duration, interval or timeout that must be positive."""
Ratio = Annotated[float, Meta(ge=0.0, le=1.0)]
"""A fraction, 0..1."""
Count = Annotated[int, Meta(ge=0)]
PositiveInt = Annotated[int, Meta(ge=1)]
NonNegative = Annotated[float, Meta(ge=0.0)]
LabelKey = Annotated[
    str,
    Meta(
        max_length=317,
        pattern=(
            r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
            r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
        ),
    ),
]
"""A Kubernetes label (or annotation) key: an optional DNS-subdomain prefix and ``/``, and a
name of at most 63 characters."""
LabelValue = Annotated[
    str, Meta(max_length=63, pattern=r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
]
"""A Kubernetes label value (at most 63 characters; may be empty)."""

S = TypeVar("S", bound="Settings")


class SettingError(ValueError):
    """A rule between fields of one section is broken; ``field`` is the field to fix."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


class Settings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """Base of every settings section (the struct options are inherited)."""

    def check(self) -> None:
        """Rules between this section's fields; raise :class:`SettingError`. Bounds of single
        fields belong in their types. Called by :func:`load_settings` on every section."""


def merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``, section by section; a ``None`` value means "not given"."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        elif isinstance(value, Mapping):
            out[key] = merge({}, value)
        elif value is not None:
            out[key] = value
    return out


def _keys(path: str) -> list[str]:
    return [k for k in path.removeprefix("$").replace("[", ".").replace("]", "").split(".") if k]


def line_of(text: str, path: str) -> int | None:
    """The 1-based line of a field path (``$.a.b[2]``) in YAML text, when found."""
    try:
        node: Any = yaml.compose(text, Loader=yaml.SafeLoader)
    except (yaml.YAMLError, RecursionError):
        return None
    line = None  # a top-level key that is not in the file has no line
    for key in _keys(path):
        if isinstance(node, yaml.MappingNode):
            match = [(k, v) for k, v in node.value if k.value == key]
            if not match:
                return line
            line = match[0][0].start_mark.line + 1
            node = match[0][1]
        elif isinstance(node, yaml.SequenceNode) and key.isdigit() and int(key) < len(node.value):
            node = node.value[int(key)]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def _given(data: Mapping[str, Any], path: str) -> bool:
    """Whether ``path`` names a value present in ``data`` (to tell flags from the file)."""
    keys = _keys(path)
    node: Any = data
    for key in keys:
        if not isinstance(node, Mapping) or key not in node:
            return False
        node = node[key]
    return bool(keys)


def _read(path: str) -> tuple[dict[str, Any], str]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"config file {path}: {reason}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path}: not valid YAML: {exc}") from exc
    except RecursionError as exc:
        raise ConfigError(f"config file {path}: nested too deeply") from exc
    if data is None:
        return {}, text
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: the top level must be a mapping")
    return data, text


def _error_path(message: str) -> str:
    """The field path of a msgspec validation message."""
    key_in = re.search(r" - at `key` in `([^`]*)`$", message)
    if key_in:
        return key_in.group(1)
    path = message.rpartition(" - at `")[2].rstrip("`") if " - at `" in message else "$"
    unknown = re.search(r"unknown field `([^`]*)`", message)
    if unknown:
        path += "." + unknown.group(1)
    return path


def _name_dict_key(data: Any, settings_type: type[Any], path: str) -> str:
    """msgspec writes ``$.idle.namespaces[...].window_s`` for a bad value under a dict key;
    find the key by converting the document with one entry of that dict at a time."""
    head, sep, tail = path.partition("[...]")
    if not sep:
        return path
    keys = _keys(head)
    parent: Any = data
    for key in keys[:-1]:
        parent = parent.get(key) if isinstance(parent, Mapping) else None
    entries = parent.get(keys[-1]) if keys and isinstance(parent, Mapping) else None
    if not isinstance(entries, Mapping):
        return path
    for key, value in entries.items():
        parent[keys[-1]] = {key: value}
        try:
            msgspec.convert(data, settings_type, strict=False)
        except (msgspec.ValidationError, RecursionError):
            return f"{head}.{key}{tail}"
        finally:
            parent[keys[-1]] = entries
    return path


def _sections(value: Any, path: str) -> Iterator[tuple[Settings, str]]:
    """Every :class:`Settings` inside ``value``, innermost first, with its field path."""
    if isinstance(value, Settings):
        for name in value.__struct_fields__:
            yield from _sections(getattr(value, name), f"{path}.{name}")
        yield value, path
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _sections(item, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _sections(item, f"{path}[{i}]")


def check_all(settings: Settings) -> None:
    """Run :meth:`Settings.check` of every section; raise :class:`SettingError` with the full
    field path (``$.leader.renew_deadline_s``) of the first broken rule."""
    for section, path in _sections(settings, "$"):
        try:
            section.check()
        except SettingError as exc:
            raise SettingError(f"{path}.{exc.field}", exc.message) from exc


def _one_line(text: str) -> str:
    """``text`` with unprintable characters escaped: a key named ``"\\n"`` in a file must not
    break the one-line error the CLI prints."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def load_settings(
    settings_type: type[S], path: str | None, overrides: Mapping[str, Any] | None = None
) -> S:
    """The file's settings (if any) with ``overrides`` (flags that were given) on top, bounds
    and the rules between fields checked. Anything wrong is a :class:`ConfigError`."""
    file_data: dict[str, Any] = {}
    text = ""
    if path:
        file_data, text = _read(path)
    given = merge({}, overrides or {})
    data = merge(file_data, given)

    def fail(field_path: str, message: str) -> ConfigError:
        from_file = bool(path) and not _given(given, field_path)
        line = line_of(text, field_path) if from_file and text else None
        where = (path or "flags") if from_file else "flags"
        loc = f"{where}:{line}" if line else where
        return ConfigError(f"{loc}: {_one_line(field_path)}: {_one_line(message)}")

    try:
        settings = msgspec.convert(data, settings_type, strict=False)
    except msgspec.ValidationError as exc:
        message = str(exc)
        field_path = _name_dict_key(data, settings_type, _error_path(message))
        raise fail(field_path, message.partition(" - at `")[0]) from exc
    except RecursionError as exc:
        raise fail("$", "nested too deeply") from exc
    try:
        check_all(settings)
    except SettingError as exc:
        raise fail(exc.field, exc.message) from exc
    return settings


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::]:9455`` for IPv6) -> (host, port); an empty host is every address."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"listen address {listen!r} is not HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)
