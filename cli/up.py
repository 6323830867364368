"""``vigil up``: the whole stack on one machine, on embedded defaults (what ``make run`` runs).

It builds the default benchmark if it is missing and, with ``--hf-model reference``, trains the
reference VLM on its train split once (a benchmark without train items, or ``--hf-model tiny``,
the default for now, serves the untrained tiny model instead), starts two model servers (the random baseline and the ``hf`` backend on that model), the
gateway, the grader and the dashboard, starts one audit round per model, then audits on the
schedule until Ctrl-C. ``--once`` runs one round, waits until it is graded, prints a summary table
and stops everything.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cli.common import UsageError
from rpc.client import sync_channel
from vigil.gateway.v1 import gateway_pb2 as gw
from vigil.gateway.v1 import gateway_pb2_grpc
from vigil.grader.v1 import grader_pb2 as gr
from vigil.grader.v1 import grader_pb2_grpc

if TYPE_CHECKING:
    from benchmark.store import Benchmark

SUMMARY_METRICS = (
    "coverage",
    "accuracy",
    "balanced_accuracy",
    "ece",
    "brier",
    "conf_wrong",
    "cw_rate",
)
TERMINAL = (gw.RUN_STATE_SUCCEEDED, gw.RUN_STATE_FAILED, gw.RUN_STATE_CANCELLED)


@dataclass
class Service:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    ports: dict[str, int] = field(default_factory=dict)


class StartFailed(Exception):
    """A service did not come up; the message names it and quotes its log."""


def _say(message: str) -> None:
    print(message, flush=True)


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(
            "    " + line for line in path.read_text(errors="replace").splitlines()[-n:]
        )
    except OSError:
        return ""


class Supervisor:
    """Starts child processes, waits for them, and stops them in reverse order."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.logs = data_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.services: list[Service] = []

    def start(self, name: str, args: list[str], timeout_s: float = 180.0) -> Service:
        ready = self.data_dir / "run" / f"{name}.json"
        ready.parent.mkdir(parents=True, exist_ok=True)
        ready.unlink(missing_ok=True)
        log_path = self.logs / f"{name}.log"
        env = dict(os.environ, VIGIL_DATA_DIR=str(self.data_dir), PYTHONUNBUFFERED="1",
                   HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")  # fmt: skip
        cmd = [sys.executable, "-m", "cli.main", "serve", *args, "--ready-file", str(ready)]
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(
                cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        service = Service(name, popen, log_path)
        self.services.append(service)
        deadline = time.monotonic() + timeout_s
        while not ready.exists():
            if popen.poll() is not None:
                raise StartFailed(f"{name} exited with code {popen.returncode}:\n{_tail(log_path)}")
            if time.monotonic() > deadline:
                raise StartFailed(
                    f"{name} was not ready after {timeout_s:.0f} s:\n{_tail(log_path)}"
                )
            time.sleep(0.1)
        service.ports = json.loads(ready.read_text())
        return service

    def check(self) -> None:
        for s in self.services:
            if s.popen.poll() is not None:
                raise StartFailed(
                    f"{s.name} stopped with code {s.popen.returncode}:\n{_tail(s.log_path)}"
                )

    def stop_all(self) -> None:
        for s in reversed(self.services):
            if s.popen.poll() is None:
                s.popen.send_signal(signal.SIGTERM)
        for s in reversed(self.services):
            try:
                s.popen.wait(20)
            except subprocess.TimeoutExpired:
                s.popen.kill()
                s.popen.wait()
        self.services.clear()


def wait_serving(address: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    with sync_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                status = stub.Check(health_pb2.HealthCheckRequest(), timeout=2).status
                if status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise StartFailed(f"{address} did not report SERVING within {timeout_s:.0f} s")
            time.sleep(0.2)


def _fmt(value: float, lower: float, upper: float, has_interval: bool) -> str:
    if math.isnan(value):
        return "n/a"
    if has_interval:
        return f"{value:.3f} [{lower:.2f},{upper:.2f}]"
    return f"{value:.3f}"


def summary_table(grader: grader_pb2_grpc.GraderServiceStub, run_ids: list[str]) -> str:
    """One row per run: the headline figures with their 95% subject-clustered intervals."""
    header = ["model", "run", "responses", *SUMMARY_METRICS]
    rows = [header]
    runs = {
        r.run_id: r
        for r in grader.ListGradedRuns(gr.ListGradedRunsRequest(page_size=1000), timeout=10).runs
    }
    for run_id in run_ids:
        values = grader.QueryMetrics(
            gr.QueryMetricsRequest(
                run_id=run_id, task="all", format="all", metrics=list(SUMMARY_METRICS)
            ),
            timeout=10,
        ).values
        by_metric = {v.metric: v for v in values}
        run = runs.get(run_id)
        row = [run.model_name if run else "?", run_id, str(run.response_count if run else 0)]
        for m in SUMMARY_METRICS:
            v = by_metric.get(m)
            row.append(_fmt(v.value, v.lower, v.upper, v.has_interval) if v else "n/a")
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.extend(_token_lines(grader, run_ids, runs))
    return "\n".join(lines)


TOKEN_METRICS = ("mean_confidence", "ece", "brier", "auroc")


def _token_lines(
    grader: grader_pb2_grpc.GraderServiceStub, run_ids: list[str], runs: dict[str, gr.GradedRun]
) -> list[str]:
    """Stated confidence beside the answer token's probability, for models that offer it."""
    from grader.token_confidence import SOURCE_AXIS

    out: list[str] = []
    for run_id in run_ids:
        token = {
            v.metric: v
            for v in grader.QueryMetrics(
                gr.QueryMetricsRequest(
                    run_id=run_id, group_axis=SOURCE_AXIS, metrics=list(TOKEN_METRICS)
                ),
                timeout=10,
            ).values
        }
        if not token:
            continue
        stated = {
            v.metric: v
            for v in grader.QueryMetrics(
                gr.QueryMetricsRequest(
                    run_id=run_id, task="all", format="all", metrics=list(TOKEN_METRICS)
                ),
                timeout=10,
            ).values
        }
        n = next(iter(token.values())).response_count
        pairs = ", ".join(
            f"{m} {stated[m].value:.3f} vs {token[m].value:.3f}"
            for m in TOKEN_METRICS
            if m in stated and m in token
        )
        model = runs[run_id].model_name if run_id in runs else run_id
        out.append(f"{model}: stated confidence vs answer-token probability ({n} answers): {pairs}")
    return [""] + out if out else []


def run_up(args: argparse.Namespace) -> int:
    from benchmark.store import ensure_builtin
    from model_servers.tiny import ensure_tiny_llava

    data_dir = Path(os.environ.get("VIGIL_DATA_DIR", "var")).resolve()
    os.environ["VIGIL_DATA_DIR"] = str(data_dir)
    bench_root = data_dir / "benchmarks"
    _say(f"vigil up: data under {data_dir}")
    bench = ensure_builtin(bench_root, args.suite, args.size, seed=args.seed, progress=True)
    _say(
        f"benchmark {bench.id}: {bench.meta.item_count} items, {bench.meta.subject_count} subjects"
    )
    model_dir, hf_name = None, "tiny-llava"
    try:
        if args.hf_model == "reference":
            model_dir = _ensure_reference_model(data_dir / "models" / "reference-vlm", bench)
        if model_dir is not None:
            hf_name = "reference-vlm"
        else:
            model_dir = ensure_tiny_llava(data_dir / "models" / hf_name)
    except FileExistsError as exc:
        raise UsageError(f"{exc}; move it away and run again") from None
    _say(f"hf model: {model_dir}")

    sup = Supervisor(data_dir)
    interrupted = False

    def on_signal(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    host = args.host
    try:
        hf = ["model", "--backend", "hf", "--model-path", str(model_dir), "--model-name",
              hf_name, "--torch-threads", "1"]  # fmt: skip
        models = [("random-baseline", ["model", "--backend", "random"]), (hf_name, hf)]
        endpoints: list[tuple[str, str]] = []
        for i, (name, cmd) in enumerate(models):
            svc = sup.start(name, [*cmd, "--host", host, "--port", str(args.model_port + i if args.model_port else 0),
                                   "--metrics-port", str(args.model_metrics_port + i if args.model_metrics_port else 0)])  # fmt: skip
            address = f"{host}:{svc.ports['grpc_port']}"
            wait_serving(address, 300)
            endpoints.append((name, address))
            _say(f"model server {name:16s} grpc {address}  metrics :{svc.ports['metrics_port']}")
        gateway = sup.start("gateway", ["gateway", "--host", host, "--port", str(args.gateway_port),
                                        "--metrics-port", str(args.gateway_metrics_port)])  # fmt: skip
        gateway_addr = f"{host}:{gateway.ports['grpc_port']}"
        _say(
            f"gateway                 grpc {gateway_addr}  metrics :{gateway.ports['metrics_port']}"
        )
        grader = sup.start("grader", ["grader", "--host", host, "--port", str(args.grader_port),
                                      "--metrics-port", str(args.grader_metrics_port),
                                      "--gateway-address", gateway_addr])  # fmt: skip
        grader_addr = f"{host}:{grader.ports['grpc_port']}"
        _say(f"grader                  grpc {grader_addr}  metrics :{grader.ports['metrics_port']}")

        gw_stub = gateway_pb2_grpc.GatewayServiceStub(sync_channel(gateway_addr))
        gr_stub = grader_pb2_grpc.GraderServiceStub(sync_channel(grader_addr))
        for name, address in endpoints:
            gw_stub.RegisterEndpoint(
                gw.RegisterEndpointRequest(
                    endpoint=gw.Endpoint(name=name, address=address, protocol=gw.PROTOCOL_VIGIL)
                ),
                timeout=10,
            )
        run_ids = []
        for name, _ in endpoints:
            run = gw_stub.StartRun(
                gw.StartRunRequest(endpoint_name=name, benchmark=bench.id), timeout=30
            ).run
            run_ids.append(run.run_id)
            _say(f"started run {run.run_id} on {name} ({run.item_count} items)")

        if not args.once:
            from google.protobuf.duration_pb2 import Duration

            for name, address in endpoints:
                gw_stub.RegisterEndpoint(
                    gw.RegisterEndpointRequest(
                        endpoint=gw.Endpoint(
                            name=name, address=address, protocol=gw.PROTOCOL_VIGIL,
                            schedule_interval=Duration(seconds=int(args.interval_s)),
                            schedule_benchmark=bench.id,
                        )
                    ),
                    timeout=10,
                )  # fmt: skip
            dash = sup.start("dashboard", ["dashboard", "--host", host, "--port", str(args.dashboard_port),
                                           "--grader-address", grader_addr,
                                           "--gateway-address", gateway_addr], timeout_s=120)  # fmt: skip
            _say(
                f"dashboard               http://{host}:{dash.ports.get('port', args.dashboard_port)}"
            )
            _say(
                f"auditing every {args.interval_s:.0f} s; logs in {sup.logs}; Ctrl-C stops everything"
            )

        failed = _wait_round(gw_stub, run_ids, sup)
        _wait_graded(gr_stub, run_ids, sup)
        _say("")
        _say(summary_table(gr_stub, run_ids))
        _say("")
        if args.once:
            if failed:
                _say("vigil up: " + "; ".join(failed))
                return 1
            return 0
        while True:
            sup.check()
            time.sleep(1.0)
    except KeyboardInterrupt:
        interrupted = True
        _say("\nstopping ...")
        return 130 if not args.once else 1
    except (StartFailed, grpc.RpcError) as exc:
        detail = exc.details() if isinstance(exc, grpc.RpcError) else str(exc)  # type: ignore[attr-defined]
        print(f"vigil up: {detail}", file=sys.stderr)
        return 1
    finally:
        sup.stop_all()
        if interrupted:
            _say("stopped.")


def _ensure_reference_model(path: Path, bench: Benchmark) -> Path | None:
    """The reference VLM at ``path``, trained once on ``bench``'s train split when missing; None
    (with a notice) when the benchmark has no train items to learn from."""
    from model_servers.reference.cli import is_complete, train_into
    from model_servers.reference.data import NoTrainItems

    if is_complete(path):
        return path
    _say(f"training the reference VLM on the train split of {bench.id} (about 5 minutes, once)")
    try:
        train_into(bench.path, path)
    except NoTrainItems as exc:
        _say(f"cannot train the reference VLM: {exc}; serving the untrained tiny model instead")
        return None
    return path


def _wait_round(
    gw_stub: gateway_pb2_grpc.GatewayServiceStub, run_ids: list[str], sup: Supervisor
) -> list[str]:
    """Wait for every run to end, printing progress; returns the failures."""
    last: dict[str, int] = {}
    while True:
        sup.check()
        runs = [gw_stub.GetRun(gw.GetRunRequest(run_id=r), timeout=10).run for r in run_ids]
        for run in runs:
            if last.get(run.run_id) != run.completed_count:
                last[run.run_id] = run.completed_count
                _say(
                    f"  {run.endpoint_name:16s} {run.completed_count:5d}/{run.item_count} recorded"
                )
        if all(r.state in TERMINAL for r in runs):
            return [
                f"run {r.run_id} on {r.endpoint_name} ended {gw.RunState.Name(r.state)}: {r.error_message}"
                for r in runs
                if r.state != gw.RUN_STATE_SUCCEEDED
            ]
        time.sleep(2.0)


def _wait_graded(gr_stub: grader_pb2_grpc.GraderServiceStub, run_ids: list[str], sup: Supervisor,
                 timeout_s: float = 300.0) -> None:  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while True:
        sup.check()
        runs = gr_stub.ListGradedRuns(gr.ListGradedRunsRequest(page_size=1000), timeout=10).runs
        if set(run_ids) <= {r.run_id for r in runs if r.final}:
            return
        if time.monotonic() > deadline:
            raise StartFailed(
                f"the grader did not finish grading {run_ids} within {timeout_s:.0f} s"
            )
        time.sleep(0.5)


def add_up_command(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = commands.add_parser("up", help="start the whole stack and audit the default models")
    p.add_argument("--once", action="store_true",
                   help="one round per model, print the summary, stop (exit 0 when all succeeded)")  # fmt: skip
    p.add_argument(
        "--suite", default="brain-mri", help="built-in benchmark suite (default brain-mri)"
    )
    p.add_argument("--size", default="small", help="suite size (default small)")
    p.add_argument("--hf-model", choices=("reference", "tiny"), default="reference",
                   help="model of the hf server: the reference VLM (default), trained once on the "
                        "benchmark's train split (the tiny model when it has none), or the "
                        "untrained tiny model (as the tests use)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="benchmark seed (default 0)")
    p.add_argument(
        "--interval-s", type=float, default=3600.0, help="audit interval (default 3600 s)"
    )
    p.add_argument("--host", default="127.0.0.1", help="interface the services bind")
    p.add_argument("--gateway-port", type=int, default=50051)
    p.add_argument("--grader-port", type=int, default=50052)
    p.add_argument("--model-port", type=int, default=50061, help="first model server port")
    p.add_argument("--gateway-metrics-port", type=int, default=9101)
    p.add_argument("--grader-metrics-port", type=int, default=9102)
    p.add_argument("--model-metrics-port", type=int, default=9111, help="first model metrics port")
    p.add_argument("--dashboard-port", type=int, default=8501)
    p.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    if args.interval_s <= 0:
        raise UsageError("--interval-s must be positive")
    return run_up(args)
