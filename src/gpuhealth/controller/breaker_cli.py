"""``gpuhealth-controller breaker status|reset``: the circuit breaker for operators, with the
credentials of their kubeconfig.

The command reads the bearer token of the kubeconfig's current (or ``--context``) user — a
``token``/``tokenFile`` or an ``exec`` credential plugin, through kubernetes_asyncio's loader
(:func:`gpuhealth.controller.kube.client.kubeconfig_token`) — and sends it to the controller
at ``--url`` (:mod:`gpuhealth.controller.http.client`); the controller reviews it
(TokenReview) and asks the API server whether that user may ``update
circuitbreakers.gpuhealth.io`` in its namespace (SubjectAccessReview; the chart's
``<fullname>-operator`` Role grants it). Client-certificate users have no token to send: use a
token or an exec plugin user. The controller must be the leader (the Service routes to it;
from outside the cluster ``kubectl port-forward`` to the leader pod, docs/operations.md
"Circuit breaker").

Exit status: 0 done (``status``: the breaker is closed), 1 refused or (``status``) open, 2 a
usage or kubeconfig error, 3 the controller could not be asked.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from typing import Any

from gpuhealth.common.errors import ConfigError
from gpuhealth.controller.http.access import BREAKER_RESOURCE
from gpuhealth.controller.http.api import BREAKER_PATH, BREAKER_RESET_PATH
from gpuhealth.controller.http.client import (
    DEFAULT_URL,
    REQUEST_TIMEOUT_S,
    ControllerClient,
    ControllerUnreachable,
    plain_http_off_host,
)
from gpuhealth.controller.kube.client import kubeconfig_token
from gpuhealth.controller.names import API_GROUP

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3


def describe(doc: dict[str, Any]) -> str:
    state = "OPEN" if doc.get("open") else "closed"
    line = (
        f"circuit breaker {state}: {doc.get('nodes_tainted_in_window', '?')} of "
        f"{doc.get('limit', '?')} new node taints in the last {doc.get('window_s', '?')} s, "
        f"trips {doc.get('trips', 0)}"
    )
    if doc.get("tripped_at"):
        line += f", tripped at {doc['tripped_at']}"
    blocked = doc.get("blocked_nodes") or []
    if blocked:
        line += f"\nblocked nodes: {', '.join(str(n) for n in blocked)}"
    if doc.get("enabled") is False:
        line += " (disabled)"
    return line


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="gpuhealth-controller breaker",
        description="Show or reset the controller's circuit breaker, authenticated with your "
        "kubeconfig's token (the reset needs update on "
        f"{BREAKER_RESOURCE}.{API_GROUP} in the "
        "controller's namespace: the chart's <fullname>-operator Role).",
    )
    ap.add_argument("action", choices=["status", "reset"])
    ap.add_argument("--url", default=DEFAULT_URL, help=f"the leader's base URL ({DEFAULT_URL})")
    ap.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
    ap.add_argument("--context", help="kubeconfig context (default: the current one)")
    ap.add_argument("--ca-file", help="CA bundle to verify an https:// controller with")
    ap.add_argument("--timeout", type=float, default=REQUEST_TIMEOUT_S, help="seconds")
    ap.add_argument("--json", action="store_true", help="print the controller's JSON answer")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    err = sys.stderr
    try:
        token = asyncio.run(kubeconfig_token(args.kubeconfig, args.context))
    except ConfigError as exc:
        if args.action == "reset":
            print(f"gpuhealth-controller breaker: {exc}", file=err)
            return EXIT_USAGE
        token = None  # a controller whose reads are open needs no credentials for status
    if token is None and args.action == "reset":
        print(
            "gpuhealth-controller breaker: the kubeconfig's user has no bearer token (a client "
            "certificate cannot be forwarded); use a token or exec-plugin user",
            file=err,
        )
        return EXIT_USAGE
    if token and plain_http_off_host(args.url):
        print(f"warning: sending your token unencrypted to {args.url}", file=err)
    client = ControllerClient(args.url, token=token, ca_file=args.ca_file, timeout_s=args.timeout)
    method, path = ("POST", BREAKER_RESET_PATH) if args.action == "reset" else ("GET", BREAKER_PATH)
    try:
        answer = client.request(method, path)
    except ControllerUnreachable as exc:
        print(f"gpuhealth-controller breaker: {exc}", file=err)
        return EXIT_UNREACHABLE
    status, body = answer.status, answer.body
    if args.json:
        print(json.dumps(body, indent=2))
    if status != 200:
        hint = {
            409: " (send it to the leader: the Service, or a port-forward to the pod "
            "holding the Lease)"
        }.get(status, "")
        print(
            f"gpuhealth-controller breaker {args.action}: HTTP {status} "
            f"{body.get('error', '')}: {body.get('message', body)}{hint}",
            file=err,
        )
        return EXIT_REFUSED if status < 500 else EXIT_UNREACHABLE
    if args.action == "reset":
        if not args.json:
            nodes = body.get("requeued_blocked_nodes") or []
            print(
                f"circuit breaker reset; requeued {len(nodes)} blocked node(s)"
                + (f": {', '.join(map(str, nodes))}" if nodes else "")
            )
        return EXIT_OK
    if not args.json:
        print(describe(body))
    return EXIT_REFUSED if body.get("open") else EXIT_OK
