"""A stream-server-only controller process for test_stream.py's SIGKILL test.

Run as ``python stream_controller_proc.py KUBECONFIG PORT NAMESPACE SERVICE_ACCOUNT OUT``:
real TokenReview auth; every delivered Event is appended to OUT as ``node xid`` and flushed,
so the test can read what this incarnation received after it is killed.
"""

from __future__ import annotations

import asyncio
import sys

from aiohttp import web

from gpuhealth.controller.kube.client import make_api_client
from gpuhealth.controller.stream.server import StreamServer
from gpuhealth.controller.stream.settings import StreamServerSettings
from gpuhealth.controller.stream.token_review import TokenReviewAuthenticator
from gpuhealth.protocol import Event, Heartbeat, Hello, Snapshot


class FileSink:
    def __init__(self, path: str) -> None:
        self._f = open(path, "a", buffering=1, encoding="ascii")  # noqa: SIM115

    def on_connect(self, node: str, hello: Hello) -> None:
        pass

    def on_message(self, node: str, msg: Snapshot | Event | Heartbeat) -> None:
        if isinstance(msg, Event):
            self._f.write(f"{node} {msg.xid}\n")

    def on_disconnect(self, node: str) -> None:
        pass


async def main(kubeconfig: str, port: int, ns: str, sa: str, out: str) -> None:
    api = await make_api_client(kubeconfig)
    settings = StreamServerSettings(agent_namespace=ns, agent_service_account=sa)
    server = StreamServer(settings, TokenReviewAuthenticator(api, "gpuhealth"), FileSink(out))
    app = web.Application()
    server.add_routes(app)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    k, p, n, s, o = sys.argv[1:6]
    asyncio.run(main(k, int(p), n, s, o))
