"""``gpuhealth-controller cleanup``: remove everything the controller wrote to the cluster
(taints, labels, annotations and the condition on Nodes under the prefix, the shard label,
its DeviceTaintRules, the idle annotation on Pods, the remediation loop's validation pods,
the leader's and the shard owners' EndpointSlices, its ConfigMaps), after stopping the
controller. The chart runs it as its pre-delete hook; the steps and their order are in
controller/cleanup/steps.py. Exit 0 done, 1 not finished (safe to run again), 2 bad
configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from gpuhealth.common import logging as glog
from gpuhealth.common.errors import ConfigError, GpuHealthError
from gpuhealth.controller.breaker.shard_store import shard_configmap
from gpuhealth.controller.cleanup.steps import CleanupCounts, CleanupTarget, ClusterCleanup
from gpuhealth.controller.kube.client import make_api_client, wait_for_api_server
from gpuhealth.controller.names import Keys
from gpuhealth.controller.settings import ControllerSettings, load_config
from gpuhealth.controller.shards.leases import shard_lease_name, shard_service_name


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="gpuhealth-controller cleanup",
        description="Remove everything the controller wrote to the cluster (taints, labels, "
        "annotations and the condition on Nodes under the prefix, its DeviceTaintRules, the idle "
        "annotation on Pods, the remediation loop's validation pods, the leader's "
        "EndpointSlice), after stopping the controller. The chart runs it as its pre-delete "
        "hook. Exit 0 done, 1 not finished (safe to run again), 2 bad configuration.",
    )
    ap.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster ServiceAccount)")
    ap.add_argument(
        "--config",
        help="the controller's YAML configuration (its prefix, Lease, Service, idle annotation)",
    )
    ap.add_argument(
        "--stop-deployment",
        default="",
        metavar="NAME",
        help="scale the controller's Deployment NAME to 0 and wait for it to stop first",
    )
    ap.add_argument(
        "--namespace",
        default=None,
        help="the controller's namespace (default: leader.namespace of the configuration)",
    )
    ap.add_argument(
        "--keep-taints",
        action="store_true",
        help="leave the taints under the prefix (and their bookkeeping annotations) in place",
    )
    ap.add_argument("--dry-run", action="store_true", help="report what would go, change nothing")
    return ap


def target_for(cfg: ControllerSettings, args: argparse.Namespace) -> CleanupTarget:
    namespace = args.namespace or os.environ.get("POD_NAMESPACE") or cfg.leader.namespace
    leader = cfg.leader
    shards = range(cfg.shards.count) if cfg.shards.count > 1 else range(0)
    configmaps = [cfg.breaker.configmap, cfg.tls.ca_configmap]
    if shards:  # past one process: each shard's breaker state, the shards' sizes
        configmaps += [shard_configmap(cfg.breaker.configmap, i) for i in shards]
        configmaps.append(cfg.shards.sizes_configmap)
    return CleanupTarget(
        keys=Keys(cfg.prefix),
        namespace=namespace,
        deployment=args.stop_deployment,
        lease=leader.lease_name if leader.enabled else "",
        shard_leases=tuple(shard_lease_name(leader.lease_name, i) for i in shards),
        service=leader.service,
        shard_services=tuple(shard_service_name(leader.service, i) for i in shards)
        if leader.service
        else (),
        idle_annotation=cfg.idle.annotation_key if cfg.idle.annotate else "",
        validation_namespace=_validation_namespace(cfg),
        keep_taints=args.keep_taints,
        configmaps=tuple(n for n in configmaps if n),
    )


def _validation_namespace(cfg: ControllerSettings) -> str:
    """Where the remediation loop creates validation pods (empty: it creates none)."""
    pod = cfg.remediation.validation.pod
    return pod.namespace if cfg.remediation.enabled and pod is not None else ""


async def run(cfg: ControllerSettings, target: CleanupTarget, dry_run: bool) -> CleanupCounts:
    api = await make_api_client(cfg.kubeconfig)
    try:
        await wait_for_api_server(api, cfg.startup_timeout_s)
        return await ClusterCleanup(api, target, cfg.cleanup, dry_run=dry_run).run()
    finally:
        await api.close()


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(list(argv))
    overrides: dict[str, Any] = {"kubeconfig": args.kubeconfig}
    try:
        cfg = load_config(args.config, overrides)
    except ConfigError as exc:
        print(f"gpuhealth-controller cleanup: {exc}", file=sys.stderr)
        return 2
    fmt = None if cfg.log_format == "auto" else cfg.log_format == "json"
    glog.configure(json=fmt, level=cfg.log_level)
    try:
        report = asyncio.run(run(cfg, target_for(cfg, args), args.dry_run))
    except ConfigError as exc:
        print(f"gpuhealth-controller cleanup: {exc}", file=sys.stderr)
        return 2
    except GpuHealthError as exc:
        print(f"gpuhealth-controller cleanup: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"dry_run": args.dry_run, **report.summary()}))
    return 0
