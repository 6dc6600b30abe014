"""``gpuhealth-controller``: run the controller (``--kubeconfig``, ``--listen``, ``--config``,
``--dry-run``). SIGTERM/SIGINT stop it cleanly: the leader gives its Lease up on the way out
and leaves every taint, label and condition it wrote in place (a restart is not an
uninstall; ``gpuhealth-controller cleanup`` removes them).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import signal
import ssl
import sys
from collections.abc import Sequence
from typing import Any

import uvloop

from gpuhealth.common import logging as glog
from gpuhealth.common.config import parse_listen
from gpuhealth.common.errors import ConfigError, GpuHealthError
from gpuhealth.common.tasks import Supervisor
from gpuhealth.controller.app import Controller
from gpuhealth.controller.compose import build_controller
from gpuhealth.controller.heap import freeze_when_synced, time_collections, tune_collector
from gpuhealth.controller.http.limits import GuardedSite, app_runner, raise_open_files_limit
from gpuhealth.controller.http.tls import (
    CertificateReloader,
    check_orders_are_encrypted,
    server_ssl_context,
)
from gpuhealth.controller.kube.client import make_api_client, wait_for_api_server
from gpuhealth.controller.settings import ControllerSettings, load_config
from gpuhealth.controller.shutdown import stop_in_order

log = glog.get_logger("controller.cli")


async def start_certificates(ctl: Controller) -> None:
    """Before the listener: the certificate the controller keeps itself in its files, and the
    CA published (``tls:``); a configuration it cannot serve is an error."""
    keeper = ctl.parts.certificates
    cfg = ctl.parts.cfg
    if (cfg.tls.secret or cfg.tls.ca_configmap) and keeper is None:
        raise ConfigError("tls.secret / tls.ca_configmap need --tls-cert-file and --tls-key-file")
    if keeper is not None:
        await keeper.start()


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="gpuhealth-controller",
        description="Run the controller (--kubeconfig, --listen, --config, --dry-run). "
        "SIGTERM/SIGINT stop it cleanly: the leader gives its Lease up on the way out and leaves "
        "every taint, label and condition it wrote in place (a restart is not an uninstall; "
        "gpuhealth-controller cleanup removes them).",
        epilog="gpuhealth-controller status [--url URL]: print a running controller's fleet "
        "(exit 1 when a node is unhealthy); gpuhealth-controller breaker status|reset: the "
        "circuit breaker, with your kubeconfig's credentials; gpuhealth-controller incident "
        "list|ack|silence|resolve: the fleet-level incidents, for on-call, with your "
        "kubeconfig's credentials; gpuhealth-controller cleanup: remove what the controller "
        "wrote, before an uninstall; see each command's --help.",
    )
    ap.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster ServiceAccount)")
    ap.add_argument("--listen", help="HOST:PORT of the HTTP server (default 0.0.0.0:8080)")
    ap.add_argument("--config", help="YAML configuration file (controller/settings.py)")
    ap.add_argument(
        "--dry-run",
        action="store_true",
        default=None,
        help="decide and log, write nothing to the API server",
    )
    ap.add_argument("--tls-cert-file", help="PEM certificate (chain) to serve HTTPS with")
    ap.add_argument("--tls-key-file", help="PEM private key for --tls-cert-file")
    return ap


def listener_tls(cfg: ControllerSettings) -> ssl.SSLContext | None:
    """The listener's TLS from ``tls_cert_file`` / ``tls_key_file`` (with the extender's
    client CA), and the rule that orders never go out in plaintext."""
    ctx = server_ssl_context(cfg.tls_cert_file, cfg.tls_key_file, cfg.extender.client_ca_file)
    check_orders_are_encrypted(
        cfg.remediation.enabled, ctx, allow_plaintext=cfg.allow_plaintext_orders
    )
    return ctx


def start_tls_reload(
    tasks: Supervisor, cfg: ControllerSettings, ssl_ctx: ssl.SSLContext | None
) -> None:
    """The reload of the files the listener serves (a renewed or rotated pair)."""
    if ssl_ctx is not None and cfg.tls_cert_file and cfg.tls_key_file:
        reloader = CertificateReloader(
            ssl_ctx,
            cfg.tls_cert_file,
            cfg.tls_key_file,
            client_ca_file=cfg.extender.client_ca_file,
        )
        tasks.start("tls_reload", lambda: reloader.run(cfg.tls_reload_interval_s))


async def serve(cfg: ControllerSettings, *, stop: asyncio.Event | None = None) -> None:
    # files someone else writes are checked before the API server is asked (a bad path fails
    # at once); a kept certificate is written only once it answers
    ssl_ctx = None if cfg.tls.secret else listener_tls(cfg)
    api = await make_api_client(cfg.kubeconfig)
    try:
        version = await wait_for_api_server(api, cfg.startup_timeout_s)
        ctl = build_controller(cfg, api)
        await start_certificates(ctl)
        if cfg.tls.secret:
            ssl_ctx = listener_tls(cfg)
    except BaseException:
        await api.close()
        raise
    log.info("api_server_reachable", host=api.configuration.host, version=version)
    tune_collector(cfg.gc_young_threshold)
    # Open connections get at most shutdown_timeout_s after the streams are drained: aiohttp
    # waits up to its timeout for a handler to finish, then as long again after cancelling it
    # (its default, 60 s, outlasts the Pod's grace period).
    runner = app_runner(
        ctl.web_app(), ctl.parts.http_limits.settings, shutdown_timeout=cfg.shutdown_timeout_s / 2
    )
    await runner.setup()
    host, port = parse_listen(cfg.listen)
    site = GuardedSite(runner, host, port, ctl.parts.http_limits, ssl_context=ssl_ctx)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    tasks = Supervisor()
    start_tls_reload(tasks, cfg, ssl_ctx)
    freeze: asyncio.Task[None] | None = None
    gc_seconds = ctl.parts.metrics.gc_seconds
    untime = time_collections(lambda gen, s: gc_seconds.labels(str(gen)).observe(s))
    try:
        try:
            await site.start()
        except OSError as exc:
            raise ConfigError(f"cannot listen on {cfg.listen}: {exc.strerror or exc}") from exc
        await ctl.start()
        if cfg.gc_freeze_at_start:
            synced = [ctl.parts.cache.synced]
            if ctl.parts.agent_pods is not None:
                synced.append(ctl.parts.agent_pods.watch.synced)
            freeze = asyncio.create_task(freeze_when_synced(synced), name="heap-freeze")
        log.info(
            "controller_started",
            listen=cfg.listen,
            dry_run=cfg.dry_run,
            tls=ssl_ctx is not None,
            open_files=resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        )
        await stop.wait()
        log.info("controller_stopping")
    finally:
        if freeze is not None:
            freeze.cancel()  # a one-shot: done, or still waiting for the first LIST
        ctl.parts.elector.retire()  # a lead lost on the way out is not taken again
        # First the agents: waiting and new handshakes told to come back (to another
        # replica), streams closed; then the parts and the Lease, then the listener.
        # Bounded as a whole (shutdown_deadline_s, below the Pod's grace period): past it
        # the step running is cancelled and the rest skipped; the API client is closed anyway.
        stopped = await stop_in_order(
            (
                ("stream", ctl.parts.stream.drain),
                ("tasks", tasks.stop),
                ("parts", ctl.stop),
                ("http", runner.cleanup),
            ),
            cfg.shutdown_deadline_s,
            always=(("api", api.close),),
        )
        if stopped.cut is not None:
            log.warning(
                "shutdown_deadline_passed",
                deadline_s=cfg.shutdown_deadline_s,
                cut=stopped.cut,
                skipped=stopped.skipped,
                steps=stopped.steps,
            )
        log.info("controller_stopped", took_s=stopped.took_s, steps=stopped.steps)
        untime()


async def _serve_then_exit(cfg: ControllerSettings) -> None:
    """:func:`serve`; once it stopped cleanly, exit at once. The process holds a socket and
    a few dozen objects per agent: tearing them down one by one (the event loop's cleanup,
    then the interpreter's) took 8 s at 19,000 agents after the stop had completed (bench
    ``fleet_scale``), past the Pod's grace period. The kernel closes what is left. Before it,
    the limit on open files is raised as far as allowed: one descriptor per agent."""
    raise_open_files_limit()
    await serve(cfg)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["status"]:  # ``gpuhealth-controller status [--url URL]``
        from gpuhealth.controller import status_cli

        return status_cli.main(argv[1:])
    if argv[:1] == ["cleanup"]:  # ``gpuhealth-controller cleanup``: before an uninstall
        from gpuhealth.controller import cleanup_cli

        return cleanup_cli.main(argv[1:])
    if argv[:1] == ["breaker"]:  # ``gpuhealth-controller breaker status|reset``
        from gpuhealth.controller import breaker_cli

        return breaker_cli.main(argv[1:])
    if argv[:1] == ["incident"]:  # ``gpuhealth-controller incident list|ack|silence|resolve``
        from gpuhealth.controller import incident_cli

        return incident_cli.main(argv[1:])
    args = parser().parse_args(argv)
    overrides: dict[str, Any] = {
        "kubeconfig": args.kubeconfig,
        "listen": args.listen,
        "dry_run": args.dry_run,
        "tls_cert_file": args.tls_cert_file,
        "tls_key_file": args.tls_key_file,
    }
    try:
        cfg = load_config(args.config, overrides)
    except ConfigError as exc:
        print(f"gpuhealth-controller: {exc}", file=sys.stderr)
        return 2
    fmt = None if cfg.log_format == "auto" else cfg.log_format == "json"
    glog.configure(json=fmt, level=cfg.log_level)
    try:
        if cfg.event_loop == "uvloop":
            uvloop.run(_serve_then_exit(cfg))
        else:
            asyncio.run(_serve_then_exit(cfg))
    except ConfigError as exc:
        print(f"gpuhealth-controller: {exc}", file=sys.stderr)
        return 2
    except GpuHealthError as exc:  # e.g. the API server did not answer at start
        print(f"gpuhealth-controller: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
