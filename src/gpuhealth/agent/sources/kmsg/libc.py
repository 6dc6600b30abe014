"""The C library calls the kernel-log follower makes through ctypes: inotify (a followed file
changed) and ``statx`` (a file's birth time, which tells a file created anew from the one
it replaced even when it got the same inode number).

Both are Linux only; where the library or the call is missing (another system, an old C
library) :func:`libc` is None or :func:`birth_time` answers None, and the follower polls or
tells files apart by their content alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import struct
import sys
from functools import cache

AT_EMPTY_PATH = 0x1000
STATX_BTIME = 0x800
_STATX_SIZE = 256
_STX_MASK = struct.Struct("=I")
_STX_BTIME = struct.Struct("=qI")
_STX_BTIME_AT = 80
"""``struct statx``: ``stx_mask`` at 0, ``stx_btime`` (``tv_sec`` s64, ``tv_nsec`` u32) at 80
(linux/stat.h)."""


@cache
def libc() -> ctypes.CDLL | None:
    """The C library with the inotify calls typed (and ``statx`` where it has it), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        lib.inotify_init1.argtypes = [ctypes.c_int]
        lib.inotify_init1.restype = ctypes.c_int
        lib.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        lib.inotify_add_watch.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    statx = getattr(lib, "statx", None)  # glibc 2.28+
    if statx is not None:
        statx.argtypes = [
            ctypes.c_int,
            ctypes.c_char_p,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.c_void_p,
        ]
        statx.restype = ctypes.c_int
    return lib


def birth_time(fd: int) -> int | None:
    """When the file open on ``fd`` was created (ns since the epoch), or None where the
    filesystem or the system does not say (``statx``'s ``STATX_BTIME``)."""
    lib = libc()
    statx = getattr(lib, "statx", None) if lib is not None else None
    if statx is None:
        return None
    buf = ctypes.create_string_buffer(_STATX_SIZE)
    if statx(fd, b"", AT_EMPTY_PATH, STATX_BTIME, buf) != 0:
        return None
    (mask,) = _STX_MASK.unpack_from(buf, 0)
    if not mask & STATX_BTIME:
        return None
    sec, nsec = _STX_BTIME.unpack_from(buf, _STX_BTIME_AT)
    return int(sec) * 1_000_000_000 + int(nsec)
