"""The agent's operator endpoint: HTTP on a UNIX socket in the state dir, never on --listen.

``POST /v1/clear`` clears the verdict on one GPU, a list of them or all; ``GET /v1/status``
is the ``/api/v1/status`` document. The socket is created at start with mode 0600 (owner
root in the chart) inside the state dir, so only someone who can ``kubectl exec`` into the
agent pod, or is root on the node (the state dir is a hostPath), can reach it: the TCP
listener is open to the whole cluster and must never change a verdict.

The socket is bound and ``chmod``-ed before it listens, so no connection is accepted while
its mode is still the umask's. A stale socket left by a killed agent is replaced; at
shutdown the socket is removed only if it is still the one this agent created.
"""

from __future__ import annotations

import os
import socket
import stat
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
from aiohttp import web

from gpuhealth.agent.engine_driver import ALL_GPUS, ClearedGpu, UnknownGpuError, select_gpus
from gpuhealth.common.errors import ConfigError, TransientError
from gpuhealth.common.logging import get_logger

__all__ = [
    "ALL_GPUS",
    "AdminServer",
    "ClearRequest",
    "ClearResponse",
    "ClearedGpu",
    "UnknownGpuError",
    "build_admin_app",
    "select_gpus",
]

log = get_logger("admin")

ADMIN_SOCKET_NAME = "admin.sock"
SOCKET_MODE = 0o600
CLEAR_PATH = "/v1/clear"
STATUS_PATH = "/v1/status"
MAX_REASON_CHARS = 1024
"""A longer ``--reason`` is cut: it goes into a log line, not a document store."""
MAX_UNIX_PATH_BYTES = 107
"""``sun_path`` holds 108 bytes with the terminating NUL on Linux."""


def admin_socket_path(state_dir: str | Path) -> Path:
    return Path(state_dir) / ADMIN_SOCKET_NAME


class ClearRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    gpu: str
    """``all``, a GPU index or a GPU UUID (case-insensitive)."""
    reason: str = ""


class ClearResponse(msgspec.Struct, kw_only=True):
    node: str
    reason: str
    gpus: list[ClearedGpu]


class ErrorResponse(msgspec.Struct, kw_only=True):
    error: str


Clearer = Callable[[str, str, str], list[ClearedGpu]]
"""(GPU selector, reason, operator description) -> what was cleared
(:meth:`~gpuhealth.agent.engine_driver.EngineDriver.clear`); raises
:class:`UnknownGpuError`."""

_json = msgspec.json.Encoder()


def _reply(status: int, body: msgspec.Struct | dict[str, Any]) -> web.Response:
    return web.Response(status=status, body=_json.encode(body), content_type="application/json")


def peer_of(request: web.Request) -> str:
    """``uid=0 pid=123`` of the connecting process (SO_PEERCRED), for the audit log line."""
    sock: Any = request.transport.get_extra_info("socket") if request.transport else None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, _gid = struct.unpack("3i", raw)
    except (AttributeError, OSError, struct.error):
        return "unknown"
    return f"uid={uid} pid={pid}"


def build_admin_app(
    clear: Clearer, node: str, status: Callable[[], dict[str, Any]]
) -> web.Application:
    async def clear_handler(request: web.Request) -> web.Response:
        try:
            req = msgspec.json.decode(await request.read(), type=ClearRequest)
        except msgspec.DecodeError as exc:
            return _reply(400, ErrorResponse(error=f"bad request: {exc}"))
        req.reason = req.reason[:MAX_REASON_CHARS]
        try:
            cleared = clear(req.gpu, req.reason, peer_of(request))
        except UnknownGpuError as exc:
            return _reply(404, ErrorResponse(error=str(exc)))
        return _reply(200, ClearResponse(node=node, reason=req.reason, gpus=cleared))

    async def status_handler(_: web.Request) -> web.Response:
        return _reply(200, status())

    app = web.Application()
    app.router.add_post(CLEAR_PATH, clear_handler)
    app.router.add_get(STATUS_PATH, status_handler)
    return app


def _bind(path: Path) -> socket.socket:
    if len(os.fsencode(path)) > MAX_UNIX_PATH_BYTES:
        raise ConfigError(f"admin socket path {path} is longer than {MAX_UNIX_PATH_BYTES} bytes")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(mode):
            raise ConfigError(f"{path} exists and is not a socket; not replacing it")
        path.unlink()
        log.info("admin_socket_replaced", path=str(path))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(os.fspath(path))
        os.chmod(path, SOCKET_MODE)
    except OSError as exc:
        sock.close()
        raise TransientError(f"cannot create the admin socket {path}: {exc}") from exc
    return sock


class AdminServer:
    """Serves :func:`build_admin_app` on ``path`` until :meth:`stop`."""

    def __init__(self, app: web.Application, path: Path) -> None:
        self._app = app
        self.path = path
        self._runner: web.AppRunner | None = None
        self._inode: int | None = None

    async def start(self) -> None:
        sock = _bind(self.path)
        self._inode = self.path.lstat().st_ino
        runner = web.AppRunner(self._app, access_log=None, handle_signals=False)
        await runner.setup()
        self._runner = runner
        await web.SockSite(runner, sock).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        try:
            if self._inode is not None and self.path.lstat().st_ino == self._inode:
                self.path.unlink()
        except FileNotFoundError:
            pass
        self._inode = None
