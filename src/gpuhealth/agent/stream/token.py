"""The bearer token from ``--token-file``: re-read whenever the file changes.

Projected ServiceAccount tokens are rotated by the kubelet (an atomic symlink swap in the
volume), so the file is checked with ``stat`` before each use and re-read when its identity,
size or mtime changed.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpuhealth.common.errors import TransientError


class TokenFile:
    def __init__(self, path: str | Path) -> None:
        self._path = Path(path)
        self._key: tuple[int, int, int, int] | None = None
        self._token = ""
        self.reads = 0

    def get(self) -> str:
        """The current token; raises TransientError when it cannot be read or is empty."""
        try:
            st = os.stat(self._path)
            key = (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns)
            if key != self._key:
                token = self._path.read_text(encoding="utf-8").strip()
                self.reads += 1
                self._key, self._token = key, token
        except OSError as exc:
            raise TransientError(f"cannot read token file {self._path}: {exc}") from exc
        if not self._token:
            raise TransientError(f"token file {self._path} is empty")
        return self._token
