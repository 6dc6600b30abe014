"""``gpuhealth-agent clear`` and ``gpuhealth-agent status``: the operator's side of the admin
socket (:mod:`gpuhealth.agent.admin`). Run them where the socket is, i.e. inside the agent pod::

    kubectl -n <ns> exec <agent-pod> -- gpuhealth-agent clear --gpu <UUID> --reason "..."
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from gpuhealth.agent.admin import (
    CLEAR_PATH,
    STATUS_PATH,
    ClearRequest,
    ClearResponse,
    ErrorResponse,
    admin_socket_path,
)
from gpuhealth.agent.settings import AgentSettings, load_config
from gpuhealth.common.errors import ConfigError, GpuHealthError

SUBCOMMANDS = ("clear", "status")
DEFAULT_TIMEOUT_S = 10.0
"""How long a command waits for the agent's answer before it gives up."""
DEFAULT_STATE_DIR = next(
    f.default for f in msgspec.structs.fields(AgentSettings) if f.name == "state_dir"
)
"""The agent's own default, so that the command finds the socket the chart's agent made."""
_BASE = "http://gpuhealth-agent"
"""Host part of the URL on the UNIX socket (only the path matters)."""


class AdminError(GpuHealthError):
    """The command could not get an answer, or the agent refused it; the message says why."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpuhealth-agent",
        description="Operator commands on a running agent, over the admin socket in its "
        "state dir.\nOnly root in the agent pod (kubectl exec) or on the node can reach it.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="{clear,status}")
    clear = sub.add_parser(
        "clear",
        help="clear the verdict on a GPU (it was repaired in a way the agent cannot see)",
        description="Clear every condition on the GPU(s): the agent reports them healthy "
        "(a fault still present comes back), the controller removes its taint, and an agent "
        "restart does not bring the verdict back.",
    )
    clear.add_argument("--gpu", required=True, metavar="UUID|INDEX|all", help="the GPU(s) to clear")
    clear.add_argument(
        "--reason", default="", metavar="TEXT", help="why (logged with the verdict_cleared line)"
    )
    status = sub.add_parser("status", help="print each GPU's state and conditions")
    status.add_argument("--json", action="store_true", help="the /api/v1/status document")
    for sp in (clear, status):
        sp.add_argument(
            "--state-dir",
            metavar="DIR",
            help=f"the agent's --state-dir (default {DEFAULT_STATE_DIR})",
        )
        sp.add_argument("--config", metavar="FILE", help="take state_dir from this config file")
        sp.add_argument(
            "--timeout",
            type=float,
            default=DEFAULT_TIMEOUT_S,
            metavar="SECONDS",
            help=f"wait this long for the agent (default {DEFAULT_TIMEOUT_S:g})",
        )
    return p


def socket_from_args(args: argparse.Namespace) -> Path:
    state_dir = args.state_dir
    if state_dir is None:
        state_dir = load_config(args.config).state_dir if args.config else DEFAULT_STATE_DIR
    return admin_socket_path(state_dir)


def _connect_error(path: Path, exc: aiohttp.ClientConnectorError) -> AdminError:
    code = exc.os_error.errno
    if code == errno.ENOENT:
        why = "the admin socket is missing: is the agent running with this --state-dir?"
    elif code == errno.ECONNREFUSED:
        why = "nothing listens on the socket: the agent is not running (stale socket)"
    elif code in (errno.EACCES, errno.EPERM):
        why = "permission denied: run as root inside the agent pod (kubectl exec)"
    else:
        why = f"cannot connect: {exc.os_error}"
    return AdminError(f"{path}: {why}")


async def call(
    path: Path, method: str, url_path: str, body: Any = None, *, timeout_s: float
) -> bytes:
    """One request on the admin socket; the body of a 2xx answer, else :class:`AdminError`."""
    if not await asyncio.to_thread(path.exists):
        raise AdminError(
            f"{path}: the admin socket is missing: is the agent running with this --state-dir?"
        )
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with (
            aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=str(path)), timeout=timeout
            ) as session,
            session.request(method, _BASE + url_path, json=body) as resp,
        ):
            data = await resp.read()
            status = resp.status
    except aiohttp.ClientConnectorError as exc:
        raise _connect_error(path, exc) from exc
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise AdminError(f"{path}: no answer from the agent: {exc!r}") from exc
    if status >= 300:
        try:
            message = msgspec.json.decode(data, type=ErrorResponse).error
        except msgspec.DecodeError:
            message = data.decode(errors="replace").strip() or f"HTTP {status}"
        raise AdminError(message)
    return data


async def clear(path: Path, gpu: str, reason: str, *, timeout_s: float) -> ClearResponse:
    request = msgspec.to_builtins(ClearRequest(gpu=gpu, reason=reason))
    data = await call(path, "POST", CLEAR_PATH, request, timeout_s=timeout_s)
    return msgspec.json.decode(data, type=ClearResponse)


def format_clear(resp: ClearResponse) -> str:
    lines = []
    for g in resp.gpus:
        head = f"GPU {g.index} {g.uuid}"
        if g.conditions:
            lines.append(
                f"{head}: cleared {', '.join(g.conditions)} (was {g.previous}, now {g.current})"
            )
        else:
            lines.append(f"{head}: nothing to clear ({g.previous})")
    if not resp.gpus:
        lines.append("no GPUs on this node")
    return "\n".join(lines)


def format_status(doc: dict[str, Any]) -> str:
    lines = [f"node {doc.get('node', '')}"]
    for g in doc.get("gpus", []):
        codes = ", ".join(c.get("code", "") for c in g.get("conditions", [])) or "-"
        lines.append(f"GPU {g['index']} {g['uuid']} {g['state']}: {codes}")
    return "\n".join(lines)


async def _run(args: argparse.Namespace) -> str:
    path = socket_from_args(args)
    if args.command == "clear":
        resp = await clear(path, args.gpu, args.reason, timeout_s=args.timeout)
        return format_clear(resp)
    data = await call(path, "GET", STATUS_PATH, timeout_s=args.timeout)
    if args.json:
        return data.decode()
    return format_status(msgspec.json.decode(data))


def main(argv: Sequence[str]) -> int:
    """``argv`` starts with the subcommand; 0 on success, 1 when the agent said no or could
    not be reached, 2 for a usage error."""
    args = build_parser().parse_args(argv)
    try:
        print(asyncio.run(_run(args)))
    except ConfigError as exc:
        print(f"gpuhealth-agent {args.command}: {exc}", file=sys.stderr)
        return 2
    except AdminError as exc:
        print(f"gpuhealth-agent {args.command}: {exc}", file=sys.stderr)
        return 1
    return 0
