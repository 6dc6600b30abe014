"""Files of the agent's state dir that describe one boot (latched verdicts, the kernel-log
position, the dcgm-exporter XID baseline): each records the boot id it was written on, is
read back only on that boot, and is replaced atomically (write, rename)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypeVar

import msgspec
import structlog


class BootScoped(msgspec.Struct, kw_only=True):
    boot_id: str


F = TypeVar("F", bound=BootScoped)


def read_boot_file(
    path: Path, kind: type[F], boot_id: str, *, log: structlog.stdlib.BoundLogger, what: str
) -> tuple[F | None, bool]:
    """(the file's content if written on ``boot_id``, whether it is from an earlier boot). A
    missing file is (None, False); an unreadable one is logged ``<what>_unreadable``."""
    try:
        saved = msgspec.json.decode(path.read_bytes(), type=kind)
    except FileNotFoundError:
        return None, False
    except (OSError, msgspec.DecodeError) as exc:
        log.warning(f"{what}_unreadable", path=str(path), error=str(exc))
        return None, False
    if saved.boot_id != boot_id:
        log.info(f"{what}_from_previous_boot", path=str(path))
        return None, True
    return saved, False


def write_boot_file(
    path: Path, content: BootScoped, *, log: structlog.stdlib.BoundLogger, what: str
) -> bool:
    """Replace ``path`` atomically; an I/O error is logged ``<what>_not_saved``, not raised."""
    tmp = path.with_suffix(".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(msgspec.json.encode(content))
        os.replace(tmp, path)
    except OSError as exc:
        log.warning(f"{what}_not_saved", path=str(path), error=str(exc))
        return False
    return True
