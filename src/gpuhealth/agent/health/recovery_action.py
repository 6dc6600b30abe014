"""The GPU recovery action the driver asks for, as data: NVML's value or the kernel's label.

The driver keeps one recovery action per GPU. NVML reports it as the field
``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` (230), whose value is an
``nvmlDeviceGpuRecoveryAction_t``, and signals changes with the event
``nvmlEventTypeGpuRecoveryAction`` (0x8000); the kernel log reports the same change as XID 154,
``GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)``.

Both are mapped through :data:`RECOVERY_ACTIONS`, one row per NVML value:

- an NVML value maps by number (:func:`from_value`); a value this table does not know is
  :data:`UNKNOWN` (degraded, CONTACT_SUPPORT: never silently healthy);
- a kernel message maps by its label (:func:`from_label`, :func:`parse_message`), never by the
  number it prints: drivers have printed other labels for the same action ("PF FLR", "OS
  Reboot") and the kernel's numbers are not documented to be NVML's.

The verdicts these rows raise are in :mod:`gpuhealth.agent.health.rules`
(``recovery-<name>`` codes); XID 154's classification uses the same rows
(:mod:`gpuhealth.agent.health.xid_catalog`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

RecoverySeverity = Literal["healthy", "degraded", "unhealthy"]

FIELD_ID = 230
"""``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` (NVML r570 and newer)."""
EVENT_TYPE = 0x8000
"""``nvmlEventTypeGpuRecoveryAction``."""


@dataclass(frozen=True, slots=True)
class RecoveryAction:
    """One value of ``nvmlDeviceGpuRecoveryAction_t`` and what gpuhealth makes of it."""

    value: int
    """NVML's enum value (``NVML_GPU_RECOVERY_ACTION_<name>``)."""
    name: str
    label: str
    """How NVML / nvidia-smi / the kernel name it."""
    severity: RecoverySeverity
    action: str
    """The action gpuhealth reports (the controller's remediation maps RESET_GPU and
    RESTART_BM to a GPU reset and a reboot)."""
    aliases: tuple[str, ...] = ()
    """Other labels drivers have printed for it (lower case)."""

    @property
    def code(self) -> str:
        """The verdict's condition code (a label value, and the taint value)."""
        return "recovery-" + self.name.lower().replace("_", "-")


NONE = RecoveryAction(0, "NONE", "None", "healthy", "IGNORE")
RECOVERY_ACTIONS: tuple[RecoveryAction, ...] = (
    NONE,
    RecoveryAction(1, "GPU_RESET", "GPU Reset Required", "unhealthy", "RESET_GPU",
                   ("pf flr", "reset")),
    RecoveryAction(2, "NODE_REBOOT", "Node Reboot Required", "unhealthy", "RESTART_BM",
                   ("os reboot", "reboot")),
    RecoveryAction(3, "DRAIN_P2P", "Drain P2P", "degraded", "DRAIN_P2P"),
    RecoveryAction(4, "DRAIN_AND_RESET", "Drain and Reset", "unhealthy", "RESET_GPU",
                   ("drain p2p and reset",)),
    RecoveryAction(5, "RECOVER_IMEX_DOMAIN", "Recover IMEX Domain", "degraded",
                   "RECOVER_IMEX_DOMAIN"),
    RecoveryAction(6, "BUS_RESET", "Bus Reset", "unhealthy", "RESET_GPU",
                   ("reset the gpu's pcie bus",)),
    RecoveryAction(7, "SYSTEM_REBOOT", "System Reboot", "unhealthy", "RESTART_BM"),
)  # fmt: skip
"""Every value NVML defines (nvidia-ml-py 13.615: NONE..SYSTEM_REBOOT)."""
UNKNOWN = RecoveryAction(-1, "UNKNOWN", "unknown", "degraded", "CONTACT_SUPPORT")
"""A value newer than this table: the driver asks for something; a person must look."""

_BY_VALUE = {r.value: r for r in RECOVERY_ACTIONS}
_LABELS: tuple[tuple[str, RecoveryAction], ...] = tuple(
    sorted(
        ((name, r) for r in RECOVERY_ACTIONS for name in (r.label.lower(), *r.aliases)),
        key=lambda item: -len(item[0]),
    )
)
"""Longest label first: ``drain p2p and reset`` before ``drain p2p`` before ``reset``."""
_TARGET = re.compile(r"\bto\s+0x[0-9a-f]+\s*\(([^)]*)\)", re.IGNORECASE)
_IS = re.compile(r"\bis\s+0x[0-9a-f]+\s*\(([^)]*)\)", re.IGNORECASE)


def from_value(value: int) -> RecoveryAction:
    """NVML's field or event value -> its row (:data:`UNKNOWN` for one this table lacks)."""
    return _BY_VALUE.get(value, UNKNOWN)


def from_label(text: str) -> RecoveryAction | None:
    """A label as a driver prints it (``Node Reboot Required``, ``OS Reboot``) -> its row."""
    t = " ".join(text.lower().split())
    for name, row in _LABELS:
        if t == name:
            return row
    for name, row in _LABELS:
        if name in t:
            return row
    return None


def parse_message(message: str) -> RecoveryAction | None:
    """The action an XID 154 message ends in: the kernel's ``... to 0x2 (Node Reboot
    Required)``, or the NVML source's :func:`describe` text ``... is 0x2 (...)``."""
    m = _TARGET.search(message) or _IS.search(message)
    return from_label(m.group(1)) if m else None


def describe(value: int) -> str:
    """The text the NVML source gives an XID 154 event (NVML events carry no message)."""
    row = from_value(value)
    return f"GPU recovery action (NVML) is 0x{value:x} ({row.label})"
