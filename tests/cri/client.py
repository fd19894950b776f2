"""A CRI v1 client in place of kubelet: the pod sandbox lifecycle over containerd's socket.

The protocol is tests/cri/runtime_v1.proto (our own subset of k8s.io/cri-api's v1 API, same
field numbers), compiled with grpc_tools.protoc into a temporary directory the first time a
client is made in a process. grpcio and grpcio-tools are test extras only.
"""

from __future__ import annotations

import importlib
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

PROTO = Path(__file__).with_name("runtime_v1.proto")
_modules: tuple[ModuleType, ModuleType] | None = None


def _compiled() -> tuple[ModuleType, ModuleType]:
    """(messages, stubs) of runtime_v1.proto, compiled once per process."""
    global _modules
    if _modules is None:
        from grpc_tools import protoc

        out = tempfile.mkdtemp(prefix="pycni-cri-proto-")
        rc = protoc.main(["protoc", f"-I{PROTO.parent}", f"--python_out={out}", f"--grpc_python_out={out}",
                          str(PROTO)])
        if rc != 0:
            raise RuntimeError(f"protoc failed on {PROTO} ({rc})")
        sys.path.insert(0, out)
        try:
            _modules = (importlib.import_module("runtime_v1_pb2"), importlib.import_module("runtime_v1_pb2_grpc"))
        finally:
            sys.path.remove(out)
    return _modules


@dataclass
class Port:
    """A hostPort of a pod, as kubelet passes it (PortMapping)."""
    container_port: int
    host_port: int
    protocol: str = "tcp"
    host_ip: str = ""


@dataclass
class Pod:
    """What kubelet knows of a pod when it asks for its sandbox."""
    name: str
    namespace: str = "default"
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    ports: list[Port] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    cgroup_parent: str = ""


class CRIError(Exception):
    """A CRI call the runtime refused: the gRPC status code's name and its details."""

    def __init__(self, method: str, code: str, details: str) -> None:
        super().__init__(f"{method}: {code}: {details}")
        self.method, self.code, self.details = method, code, details


class CRIClient:
    """RuntimeService of a CRI v1 runtime on a unix socket (a path the test process can open)."""

    def __init__(self, socket_path: str, timeout: float = 120) -> None:
        import grpc

        self.pb, stubs = _compiled()
        self.timeout = timeout
        self._channel = grpc.insecure_channel(f"unix://{socket_path}")
        self._stub = stubs.RuntimeServiceStub(self._channel)

    def _call(self, method: str, request: Any) -> Any:
        import grpc

        try:
            return getattr(self._stub, method)(request, timeout=self.timeout)
        except grpc.RpcError as e:
            raise CRIError(method, e.code().name, e.details() or "") from None

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> CRIClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the calls -----------------------------------------------------------------------------

    def version(self) -> Any:
        return self._call("Version", self.pb.VersionRequest(version="v1"))

    def wait_ready(self, timeout: float = 60) -> Any:
        """Version, retried until the runtime answers (containerd loads its CRI plugin late)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.version()
            except CRIError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def sandbox_config(self, pod: Pod) -> Any:
        pb = self.pb
        protocols = {"tcp": pb.TCP, "udp": pb.UDP, "sctp": pb.SCTP}
        return pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=pod.name, uid=pod.uid, namespace=pod.namespace, attempt=0),
            hostname=pod.name,
            port_mappings=[pb.PortMapping(protocol=protocols[p.protocol], container_port=p.container_port,
                                          host_port=p.host_port, host_ip=p.host_ip) for p in pod.ports],
            labels=pod.labels,
            annotations=pod.annotations,
            linux=pb.LinuxPodSandboxConfig(
                cgroup_parent=pod.cgroup_parent,
                security_context=pb.LinuxSandboxSecurityContext(
                    namespace_options=pb.NamespaceOption(network=pb.POD, pid=pb.CONTAINER, ipc=pb.POD))))

    def run_pod(self, pod: Pod) -> str:
        """RunPodSandbox: the sandbox's ID once its network is up and its process runs."""
        resp = self._call("RunPodSandbox", self.pb.RunPodSandboxRequest(config=self.sandbox_config(pod)))
        return str(resp.pod_sandbox_id)

    def status(self, sandbox_id: str, verbose: bool = False) -> Any:
        return self._call("PodSandboxStatus", self.pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id,
                                                                               verbose=verbose))

    def ips(self, sandbox_id: str) -> list[str]:
        """The pod's addresses as the runtime reports them to kubelet (first the primary)."""
        net = self.status(sandbox_id).status.network
        return [net.ip, *(extra.ip for extra in net.additional_ips)] if net.ip else []

    def stop(self, sandbox_id: str) -> None:
        self._call("StopPodSandbox", self.pb.StopPodSandboxRequest(pod_sandbox_id=sandbox_id))

    def remove(self, sandbox_id: str) -> None:
        self._call("RemovePodSandbox", self.pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id))

    def stop_remove(self, sandbox_id: str) -> None:
        """What kubelet does when a pod goes: StopPodSandbox (tears the network down), then Remove."""
        self.stop(sandbox_id)
        self.remove(sandbox_id)

    def list(self, ready: bool | None = None) -> list[Any]:
        flt = self.pb.PodSandboxFilter()
        if ready is not None:
            flt.state.state = self.pb.SANDBOX_READY if ready else self.pb.SANDBOX_NOTREADY
        return list(self._call("ListPodSandbox", self.pb.ListPodSandboxRequest(filter=flt)).items)
