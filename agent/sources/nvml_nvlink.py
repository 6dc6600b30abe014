"""NVLink state and error counters of one GPU, read through NVML in that GPU's thread.

Support is tracked per (link, counter): one NOT_SUPPORTED counter hides only itself, and a
link whose four legacy counters (DL replay, recovery, CRC flit, CRC data) all answer
NOT_SUPPORTED, as on NVLink5 drivers, is read through its per-link error fields (161-163,
scope id = the link) instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuhealth.agent.sources.nvml_fields import field_int

if TYPE_CHECKING:
    from gpuhealth.agent.sources.nvml_device import NvmlGpu

MAX_LINKS = 64
_NVLINK_COUNTERS = (0, 1, 2, 3)  # DL_REPLAY, DL_RECOVERY, DL_CRC_FLIT, DL_CRC_DATA
_NVLINK_FIELDS = (
    ("NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY", 161),
    ("NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY", 162),
    ("NVML_FI_DEV_NVLINK_ERROR_DL_CRC", 163),
)
"""Per-link error fields (scope id = link), where the legacy counters are NOT_SUPPORTED."""


@dataclass(frozen=True, slots=True)
class _LinkKeys:
    """The support keys of one link: its state, each legacy counter, its error fields."""

    state: str
    counters: tuple[str, ...]
    fields: str


_LINK_KEYS = tuple(
    _LinkKeys(f"nvlink{i}", tuple(f"nvlink{i}.err{c}" for c in _NVLINK_COUNTERS), f"nvlink{i}.fv")
    for i in range(MAX_LINKS)
)


class NvlinkReader:
    def __init__(self, nvml: Any, opt: Callable[..., Any]) -> None:
        self._nvml = nvml
        self._opt = opt

    def read(self, g: NvmlGpu) -> tuple[int | None, int | None, int | None]:
        """Links up, links with a state, errors: support is tracked per (link, counter), so
        one NOT_SUPPORTED counter hides only itself. A link whose four legacy counters are all
        NOT_SUPPORTED (NVLink5 drivers) is read through its per-link error fields instead."""
        if not g.links:
            return (None, None, None)
        n, h, opt, unsupported = self._nvml, g.handle, self._opt, g.unsupported
        up = total = errors = 0
        for link in g.links:
            keys = _LINK_KEYS[link]
            state = opt(g, keys.state, n.nvmlDeviceGetNvLinkState, h, link)
            if keys.state in unsupported:
                continue
            total += 1
            if not state:
                continue
            up += 1
            for counter, key in zip(_NVLINK_COUNTERS, keys.counters, strict=True):
                errors += opt(g, key, n.nvmlDeviceGetNvLinkErrorCounter, h, link, counter) or 0
            if unsupported.issuperset(keys.counters):
                errors += self._link_fields(g, link, keys.fields)
        reported = any(
            not unsupported.issuperset(_LINK_KEYS[link].counters)
            or _LINK_KEYS[link].fields not in unsupported
            for link in g.links
        )
        return (up, total, errors if reported else None)

    def _link_fields(self, g: NvmlGpu, link: int, key: str) -> int:
        if key in g.unsupported:
            return 0
        n = self._nvml
        ids = [(getattr(n, name, fid), link) for name, fid in _NVLINK_FIELDS]
        values = self._opt(g, key, n.nvmlDeviceGetFieldValues, g.handle, ids)
        if values is None:
            return 0
        rets = [fv.nvmlReturn for fv in values]
        if all(r in (n.NVML_ERROR_NOT_SUPPORTED, n.NVML_ERROR_FUNCTION_NOT_FOUND) for r in rets):
            g.unsupported.add(key)
            return 0
        return sum(field_int(fv) for fv in values if fv.nvmlReturn == n.NVML_SUCCESS)
