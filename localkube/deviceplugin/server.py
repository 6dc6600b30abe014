"""The device plugin's gRPC server and its registration with the kubelet."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from gpuhealth.common.logging import get_logger
from localkube.deviceplugin._pb import deviceplugin_pb2 as api_pb2
from localkube.deviceplugin._pb import deviceplugin_pb2_grpc as api_pb2_grpc

log = get_logger("deviceplugin")

API_VERSION = "v1beta1"
KUBELET_SOCKET_NAME = "kubelet.sock"
REGISTER_TIMEOUT_S = 10.0
"""How long one Register call may take."""
WATCH_INTERVAL_S = 0.5
"""How often the kubelet's socket is checked; a new one means the kubelet restarted (and
removed our socket): serve and register again."""
WORKERS = 4


class _Servicer(api_pb2_grpc.DevicePluginServicer):  # type: ignore[misc]
    def __init__(
        self, device_ids: Sequence[str], stop: threading.Event, record: Path | None
    ) -> None:
        self.device_ids = list(device_ids)
        self.stop = stop
        self.record = record

    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return api_pb2.DevicePluginOptions()

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:
        devices = [api_pb2.Device(ID=d, health="Healthy") for d in self.device_ids]
        yield api_pb2.ListAndWatchResponse(devices=devices)
        # The kubelet keeps this stream open; the devices never change.
        while not self.stop.wait(1.0) and context.is_active():
            pass

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        return api_pb2.PreferredAllocationResponse()

    def Allocate(self, request: Any, context: Any) -> Any:
        responses = []
        for req in request.container_requests:
            ids = list(req.devices_ids)
            log.info("allocate", devices=ids)
            if self.record is not None:
                with self.record.open("a") as f:
                    f.write(json.dumps({"devices": ids}) + "\n")
            # What the NVIDIA device plugin sets for the NVIDIA container runtime.
            envs = {"NVIDIA_VISIBLE_DEVICES": ",".join(ids)}
            responses.append(api_pb2.ContainerAllocateResponse(envs=envs))
        return api_pb2.AllocateResponse(container_responses=responses)

    def PreStartContainer(self, request: Any, context: Any) -> Any:
        return api_pb2.PreStartContainerResponse()


class DevicePluginServer:
    """Serves ``resource`` with ``device_ids`` on ``<socket_dir>/<name>.sock`` and keeps it
    registered with the kubelet at ``<socket_dir>/kubelet.sock``."""

    def __init__(
        self,
        resource: str,
        device_ids: Sequence[str],
        socket_dir: Path,
        name: str,
        record: Path | None = None,
    ) -> None:
        self.resource = resource
        self.record = record
        self.device_ids = list(device_ids)
        self.socket_dir = socket_dir
        self.endpoint = f"{name}.sock"
        self.stop = threading.Event()
        self._server: grpc.Server | None = None

    @property
    def socket(self) -> Path:
        return self.socket_dir / self.endpoint

    def _serve(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None)
        self.socket.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=WORKERS))
        api_pb2_grpc.add_DevicePluginServicer_to_server(
            _Servicer(self.device_ids, self.stop, self.record), server
        )
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server

    def _register(self) -> None:
        kubelet = self.socket_dir / KUBELET_SOCKET_NAME
        with grpc.insecure_channel(f"unix://{kubelet}") as channel:
            api_pb2_grpc.RegistrationStub(channel).Register(
                api_pb2.RegisterRequest(
                    version=API_VERSION,
                    endpoint=self.endpoint,
                    resource_name=self.resource,
                    options=api_pb2.DevicePluginOptions(),
                ),
                timeout=REGISTER_TIMEOUT_S,
            )
        log.info("registered", resource=self.resource, devices=len(self.device_ids))

    def run(self) -> None:
        """Serve and register; again whenever the kubelet restarts; until :attr:`stop`."""
        kubelet = self.socket_dir / KUBELET_SOCKET_NAME
        registered_with: int | None = None
        try:
            while not self.stop.is_set():
                try:
                    inode = kubelet.stat().st_ino
                except FileNotFoundError:
                    inode = None
                if inode is not None and (inode != registered_with or not self.socket.exists()):
                    try:
                        self._serve()
                        self._register()
                        registered_with = inode
                    except grpc.RpcError as exc:
                        log.warning("register failed; retrying", error=str(exc))
                self.stop.wait(WATCH_INTERVAL_S)
        finally:
            if self._server is not None:
                self._server.stop(grace=1.0).wait()
            self.socket.unlink(missing_ok=True)
