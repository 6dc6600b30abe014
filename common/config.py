"""Settings from a YAML file with command-line overrides on top, for agent and controller.

Errors are :class:`~common.errors.ConfigError` naming the file, the line (when it can be
found) and the field, e.g. ``/etc/gpuhealth/agent.yaml:4: Expected `float`, got `str` -
at `$.health.clean_window_s```.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import yaml

from gpuhealth.common.errors import ConfigError

T = TypeVar("T")


def merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``, section by section; a ``None`` value means "not given"."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        elif value is not None:
            out[key] = value
    return out


def line_of(text: str, path: str) -> int | None:
    """The 1-based line of a msgspec error path (``$.a.b[2]``) in YAML text, when found."""
    try:
        node: Any = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    keys = [k for k in path.removeprefix("$").replace("[", ".").replace("]", "").split(".") if k]
    line = node.start_mark.line + 1 if node is not None else None
    for key in keys:
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


def _read(path: str) -> tuple[dict[str, Any], str]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror or exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path}: not valid YAML: {exc}") from exc
    if data is None:
        return {}, text
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: the top level must be a mapping")
    return data, text


def load_settings(
    settings_type: type[T], path: str | None, overrides: Mapping[str, Any] | None = None
) -> T:
    """The file's settings (if any) with ``overrides`` (flags that were given) on top."""
    data: dict[str, Any] = {}
    text = ""
    if path:
        data, text = _read(path)
    data = merge(data, overrides or {})
    try:
        return msgspec.convert(data, settings_type, strict=False)
    except msgspec.ValidationError as exc:
        message = str(exc)
        field_path = message.rpartition(" - at `")[2].rstrip("`") if " - at `" in message else "$"
        unknown = re.search(r"unknown field `([^`]*)`", message)
        if unknown:
            field_path += "." + unknown.group(1)
        line = line_of(text, field_path) if text else None
        where = path or "flags"
        loc = f"{where}:{line}" if line else where
        raise ConfigError(f"{loc}: {message}") from exc
