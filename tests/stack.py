"""Start Vigil's real processes for tests, on ports the OS assigns.

Each service is started as ``python -m cli.main serve ... --port 0 --metrics-port 0 --ready-file F``
and reports its bound ports in F; nothing here picks a fixed port or probes-then-closes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from vigil.gateway.v1 import gateway_pb2 as gw
from vigil.gateway.v1 import gateway_pb2_grpc
from vigil.grader.v1 import grader_pb2 as gr
from vigil.grader.v1 import grader_pb2_grpc

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.ports['grpc_port']}"

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


class Stack:
    """Real Vigil services as subprocesses under one temporary folder."""

    def __init__(self, root: Path, benchmark_root: Path) -> None:
        self.root = root
        self.benchmark_root = benchmark_root
        self.procs: dict[str, Proc] = {}
        root.mkdir(parents=True, exist_ok=True)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["VIGIL_DATA_DIR"] = str(self.root / "var")
        env["PYTHONUNBUFFERED"] = "1"
        env["HF_HUB_OFFLINE"] = "1"
        env["TRANSFORMERS_OFFLINE"] = "1"
        return env

    def start(self, name: str, args: list[str], timeout_s: float = 90.0, port: int = 0) -> Proc:
        ready = self.root / f"{name}.ready.json"
        ready.unlink(missing_ok=True)
        log_path = self.root / f"{name}.log"
        cmd = [sys.executable, "-m", "cli.main", "serve", *args,
               "--host", "127.0.0.1", "--port", str(port), "--metrics-port", "0",
               "--ready-file", str(ready)]  # fmt: skip
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(cmd, cwd=REPO, env=self.env(), stdout=log, stderr=log)
        proc = Proc(name, popen, log_path)
        self.procs[name] = proc
        deadline = time.monotonic() + timeout_s
        while not ready.exists():
            if popen.poll() is not None:
                raise RuntimeError(f"{name} exited with {popen.returncode}:\n{proc.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} not ready after {timeout_s}s:\n{proc.log_tail()}")
            time.sleep(0.05)
        proc.ports = json.loads(ready.read_text())
        return proc

    def start_model(
        self, name: str, backend: str = "random", extra: list[str] | None = None, port: int = 0
    ) -> Proc:
        proc = self.start(name, ["model", "--backend", backend, *(extra or [])], port=port)
        wait_serving(proc.address)
        return proc

    def start_gateway(self, name: str = "gateway", extra: list[str] | None = None) -> Proc:
        return self.start(
            name,
            ["gateway", "--db-path", str(self.root / "gateway.duckdb"),
             "--benchmark-root", str(self.benchmark_root), *(extra or [])],
        )  # fmt: skip

    def start_grader(self, gateway: Proc, name: str = "grader", db: Path | None = None,
                     extra: list[str] | None = None) -> Proc:  # fmt: skip
        return self.start(
            name,
            ["grader", "--db-path", str(db or self.root / "grader.duckdb"),
             "--benchmark-root", str(self.benchmark_root),
             "--gateway-address", gateway.address, *(extra or [])],
        )  # fmt: skip

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> int:
        proc = self.procs.pop(name)
        if proc.popen.poll() is None:
            proc.popen.send_signal(sig)
            try:
                proc.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait()
        return proc.popen.returncode

    def close(self) -> None:
        for name in list(self.procs):
            self.stop(name)


def wait_serving(address: str, timeout_s: float = 90.0) -> None:
    """Wait until the server's overall health is SERVING."""
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{address} not SERVING after {timeout_s}s")
            time.sleep(0.1)


def gateway_stub(address: str) -> gateway_pb2_grpc.GatewayServiceStub:
    return gateway_pb2_grpc.GatewayServiceStub(grpc.insecure_channel(address))


def grader_stub(address: str) -> grader_pb2_grpc.GraderServiceStub:
    return grader_pb2_grpc.GraderServiceStub(grpc.insecure_channel(address))


def register(gateway: gateway_pb2_grpc.GatewayServiceStub, name: str, address: str,
             concurrency: int = 4) -> None:  # fmt: skip
    gateway.RegisterEndpoint(
        gw.RegisterEndpointRequest(
            endpoint=gw.Endpoint(
                name=name, address=address, protocol=gw.PROTOCOL_VIGIL, max_concurrency=concurrency
            )  # fmt: skip
        ),
        timeout=10,
    )


def wait_run(gateway: gateway_pb2_grpc.GatewayServiceStub, run_id: str,
             timeout_s: float = 180.0) -> gw.Run:  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while True:
        run = gateway.GetRun(gw.GetRunRequest(run_id=run_id), timeout=10).run
        if run.state in (gw.RUN_STATE_SUCCEEDED, gw.RUN_STATE_FAILED, gw.RUN_STATE_CANCELLED):
            return run
        if time.monotonic() > deadline:
            raise TimeoutError(f"run {run_id} still {run.state} after {timeout_s}s")
        time.sleep(0.2)


def wait_graded(grader: grader_pb2_grpc.GraderServiceStub, run_ids: list[str],
                timeout_s: float = 120.0) -> None:  # fmt: skip
    """Wait until the grader holds final figures for every run."""
    deadline = time.monotonic() + timeout_s
    while True:
        runs = grader.ListGradedRuns(gr.ListGradedRunsRequest(page_size=1000), timeout=10).runs
        final = {r.run_id for r in runs if r.final}
        if set(run_ids) <= final:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"runs {sorted(set(run_ids) - final)} not graded in {timeout_s}s")
        time.sleep(0.2)


def audit_item_ids(bench) -> set[str]:  # type: ignore[no-untyped-def]
    """The items an image run replays: the audit split, without items whose image is missing."""
    manifest = bench.items(columns=["item_id", "split", "image_missing"])
    keep = (manifest["split"] != "train") & ~manifest["image_missing"].astype(bool)
    return set(manifest.loc[keep, "item_id"])
