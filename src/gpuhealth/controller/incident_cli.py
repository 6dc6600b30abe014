"""``gpuhealth-controller incident list|ack|silence|resolve``: on-call's lifecycle of the
fleet-level incidents, with the credentials of their kubeconfig.

The incidents are GPUIncident objects (``kubectl get gpuincidents``). ``list`` prints them
(the open ones; ``--all`` the closed ones too) as ``gpuhealth-controller status`` does, with
on-call's part. ``ack``, ``silence`` (``--until``: an RFC 3339 time or a duration such as
``2h``, ``30m``, ``1d``) and ``resolve`` patch the object's ``spec.lifecycle`` with ``{by,
at, reason}``, ``by`` being the user the API server knows the kubeconfig's credentials as (a
SelfSubjectReview): the API server checks RBAC (the chart's ``<fullname>-oncall`` ClusterRole)
and its admission policy checks that ``by`` is the requesting user. The controller applies it
through its watch: an acknowledged or silenced incident stops paging; a resolved one closes
and its decision is lifted (the domain taint, the GPU's blame, an override's taint put back).

Exit status: 0 done, 1 refused (not allowed, no such incident, the admission policy said no),
2 a usage or kubeconfig error, 3 the API server could not be asked.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from gpuhealth.common.errors import ConfigError
from gpuhealth.controller.incidents.incident_store import list_incidents, patch_lifecycle
from gpuhealth.controller.incidents.lifecycle import ActionName, OnCallAction
from gpuhealth.controller.kube.client import operator_api_client, who_am_i
from gpuhealth.controller.kube.rest import KubeError, TransientKubeError
from gpuhealth.controller.status_cli import incident_lines

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
REQUEST_TIMEOUT_S = 10.0
ACTIONS: dict[str, ActionName] = {
    "ack": "acknowledged",
    "silence": "silenced",
    "resolve": "resolved",
}
_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class UsageError(ValueError):
    """A bad argument (exit 2)."""


def parse_until(text: str, now: datetime) -> datetime:
    """``--until``: an RFC 3339 time (with its offset, or UTC) or a duration from ``now``
    (``90s``, ``30m``, ``2h``, ``1d``); it must lie ahead."""
    m = _DURATION.match(text.strip())
    if m:
        until = now + timedelta(seconds=int(m.group(1)) * _UNITS[m.group(2)])
    else:
        try:
            until = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        except ValueError as exc:
            raise UsageError(f"--until {text!r}: not a time (RFC 3339) nor a duration") from exc
        if until.tzinfo is None:
            until = until.replace(tzinfo=UTC)
    if until <= now:
        raise UsageError(f"--until {text!r}: it has passed")
    return until


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="gpuhealth-controller incident",
        description="List the fleet-level incidents (GPUIncidents), or acknowledge, silence "
        "or resolve one, with your kubeconfig's credentials (the chart's <fullname>-oncall "
        "ClusterRole allows it; the API server records you as the one who did it). Exit 0 "
        "done, 1 refused, 2 usage or kubeconfig error, 3 API server unreachable.",
    )
    ap.add_argument("action", choices=["list", *ACTIONS])
    ap.add_argument("id", nargs="?", help="the incident (its GPUIncident's name)")
    ap.add_argument("--reason", help="why (ack, silence, resolve: required)")
    ap.add_argument("--until", help="silence: until when (RFC 3339, or a duration: 30m, 2h, 1d)")
    ap.add_argument("--all", action="store_true", help="list: the closed incidents too")
    ap.add_argument("--json", action="store_true", help="print JSON")
    ap.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
    ap.add_argument("--context", help="kubeconfig context (default: the current one)")
    ap.add_argument("--timeout", type=float, default=REQUEST_TIMEOUT_S, help="seconds")
    return ap


def _check(args: argparse.Namespace, now: datetime) -> OnCallAction | None:
    """The action the arguments ask for (None: list); UsageError when they do not fit."""
    if args.action == "list":
        return None
    if not args.id:
        raise UsageError(f"{args.action} needs the incident's ID")
    if not args.reason or not args.reason.strip():
        raise UsageError(f"{args.action} needs --reason")
    until = None
    if args.action == "silence":
        if not args.until:
            raise UsageError("silence needs --until")
        until = parse_until(args.until, now)
    elif args.until:
        raise UsageError("--until is for silence only")
    return OnCallAction(by="", at=now, reason=args.reason.strip(), until=until)


async def _run(args: argparse.Namespace, action: OnCallAction | None) -> tuple[int, Any]:
    api = await operator_api_client(args.kubeconfig, args.context)
    try:
        now = action.at if action is not None else datetime.now(UTC)
        if action is None:
            items = await list_incidents(api, timeout_s=args.timeout)
            shown = [i for item in items if (i := item.incident()) is not None]
            shown = [i for i in shown if args.all or i.open]
            shown.sort(key=lambda i: (not i.open, i.opened_at))
            return EXIT_OK, [i.to_dict(now) for i in shown]
        by = await who_am_i(api, timeout_s=args.timeout)
        if not by:
            raise ConfigError("the API server did not say who your credentials are")
        stored = await patch_lifecycle(
            api,
            args.id,
            ACTIONS[args.action],
            OnCallAction(by, action.at, action.reason, action.until),
            timeout_s=args.timeout,
        )
        incident = stored.incident()
        return EXIT_OK, {"id": stored.name, "by": by, **(incident.to_dict(now) if incident else {})}
    finally:
        await api.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    err = sys.stderr
    try:
        action = _check(args, datetime.now(UTC))
        code, out = asyncio.run(_run(args, action))
    except (UsageError, ConfigError) as exc:
        print(f"gpuhealth-controller incident: {exc}", file=err)
        return EXIT_USAGE
    except TransientKubeError as exc:
        print(f"gpuhealth-controller incident: {exc}", file=err)
        return EXIT_UNREACHABLE
    except KubeError as exc:
        print(f"gpuhealth-controller incident {args.action}: refused: {exc}", file=err)
        return EXIT_REFUSED
    if args.json:
        print(json.dumps(out, indent=2))
    elif isinstance(out, list):
        print("\n".join(incident_lines(out)) if out else "no incidents")
    else:
        verb = {"ack": "acknowledged", "silence": "silenced", "resolve": "resolved"}
        print(f"incident {out['id']} {verb[args.action]} by {out['by']}")
    return code
