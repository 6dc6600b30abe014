"""Linux inotify through ctypes (libc's inotify_init1 / inotify_add_watch): wake when a followed
file changes instead of polling it.

Only what the kernel-log follower needs: one instance, watches on a file and on its
directory, a non-blocking descriptor to ``select`` on, and draining the pending events (their
content does not matter: after any event the follower re-checks the file itself). Where
inotify is missing (not Linux, no libc symbol, the per-user instance or watch limit reached)
:func:`open_inotify` returns None and the caller polls.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import sys
from functools import cache

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = 0o2000000

FILE_EVENTS = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_DELETE_SELF | IN_MOVE_SELF
"""Written to, truncated (attrib), replaced or removed."""
DIR_EVENTS = IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE
"""A file (re)appearing or leaving the directory: rotation."""


@cache
def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_init1.restype = ctypes.c_int
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        libc.inotify_add_watch.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


class Inotify:
    """One inotify instance; close it when done."""

    def __init__(self, fd: int, libc: ctypes.CDLL) -> None:
        self.fd = fd
        self._libc = libc

    def watch(self, path: str, mask: int) -> bool:
        """Add a watch; False when the path cannot be watched (missing, or the limit)."""
        wd: int = self._libc.inotify_add_watch(self.fd, os.fsencode(path), mask)
        return wd >= 0

    def drain(self) -> int:
        """Read and discard every pending event; how many bytes there were."""
        total = 0
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                return total
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise
            if not chunk:
                return total
            total += len(chunk)

    def close(self) -> None:
        os.close(self.fd)


def open_inotify() -> Inotify | None:
    """A non-blocking inotify instance, or None where inotify cannot be used."""
    libc = _libc()
    if libc is None:
        return None
    fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
    if fd < 0:
        return None
    return Inotify(fd, libc)
