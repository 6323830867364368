"""Helpers for tests of model servers: real servers and real backends, no mocks.

``start_model_server`` runs ``python -m model_servers.main`` on OS-chosen ports and reads them from
the ready file. ``GatedBackend`` is a real random baseline whose ``load`` (and, optionally,
``generate``) waits for an event, so a test can watch a server while it loads or generates.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from model_servers.backends.base import BackendSettings, GenerationInput, GenerationOutput
from model_servers.backends.baseline import RandomBackend

REPO_ROOT = Path(__file__).resolve().parent.parent


def png_bytes(
    width: int = 48, height: int = 40, color: tuple[int, int, int] = (90, 30, 30)
) -> bytes:
    """A small encoded PNG."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buffer, format="PNG")
    return buffer.getvalue()


class GatedBackend(RandomBackend):
    """The random baseline, with a ``load`` that blocks until ``release_load`` and a ``generate``
    that blocks while ``hold_generate`` is clear (it is set, i.e. open, by default)."""

    name = "gated"

    def __init__(
        self, settings: BackendSettings | None = None, fail_load: str | None = None
    ) -> None:
        super().__init__(settings or BackendSettings())
        self.release_load = threading.Event()
        self.hold_generate = threading.Event()
        self.hold_generate.set()
        self.generating = threading.Event()
        self._fail_load = fail_load

    def load(self) -> None:
        if not self.release_load.wait(timeout=60):
            raise TimeoutError("load was never released")
        if self._fail_load:
            from model_servers.backends.base import BackendLoadError

            raise BackendLoadError(self._fail_load)

    def generate(self, request: GenerationInput) -> GenerationOutput:
        self.generating.set()
        self.hold_generate.wait(timeout=60)
        return super().generate(request)


@dataclass
class ServerProcess:
    """A model server started as a subprocess."""

    process: subprocess.Popen[str]
    grpc_port: int
    metrics_port: int
    stderr_path: Path
    notes: dict[str, object] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def terminate(self, timeout: float = 10.0) -> int:
        """SIGTERM, then wait; the exit status (kills and raises if it does not exit in time)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise


def server_env() -> dict[str, str]:
    """The environment for a server subprocess: offline Hugging Face, no VIGIL_MODEL_* leaking in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIGIL_MODEL_")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    return env


def model_server_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "model_servers.main", *args]


def start_model_server(workdir: Path, *args: str, timeout: float = 60.0) -> ServerProcess:
    """Start a server on ports the OS chooses and wait for its ready file.

    ``args`` are extra flags (``--backend hf --model-path DIR``). Raises with the server's stderr
    if it exits before it is ready.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    ready = workdir / f"ready-{time.monotonic_ns()}.json"
    stderr_path = ready.with_suffix(".stderr")
    command = model_server_command(
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--metrics-port",
        "0",
        "--ready-file",
        str(ready),
        *args,
    )
    with stderr_path.open("w") as stderr:
        process = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            env=server_env(),
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            text=True,
        )
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if process.poll() is not None:
            raise RuntimeError(
                f"model server exited with {process.returncode}:\n{stderr_path.read_text()}"
            )
        if time.monotonic() > deadline:
            process.kill()
            process.wait()
            raise TimeoutError(f"model server not ready in {timeout}s:\n{stderr_path.read_text()}")
        time.sleep(0.01)
    ports = json.loads(ready.read_text())
    return ServerProcess(process, int(ports["grpc_port"]), int(ports["metrics_port"]), stderr_path)


def health_status(address: str, service: str = "", timeout: float = 2.0) -> str:
    """The health status name (``SERVING``, ``NOT_SERVING``, ...) of ``service`` at ``address``."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from rpc.client import sync_channel

    with sync_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def wait_until_serving(address: str, timeout: float = 60.0, service: str = "") -> list[str]:
    """Poll health until SERVING; the distinct statuses seen, in order."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        status = health_status(address, service)
        if not seen or seen[-1] != status:
            seen.append(status)
        if status == "SERVING":
            return seen
        if time.monotonic() > deadline:
            raise TimeoutError(f"{address} not SERVING after {timeout}s; saw {seen}")
        time.sleep(0.02)
