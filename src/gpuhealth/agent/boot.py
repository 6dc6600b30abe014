"""The kernel's boot id: latched verdicts are kept per boot, and the controller sees reboots."""

from __future__ import annotations

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def read_boot_id(path: str = BOOT_ID_PATH) -> str:
    """The kernel's boot id (changes on every reboot); ``unknown`` where there is none."""
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()[:128] or "unknown"
    except OSError:
        return "unknown"
