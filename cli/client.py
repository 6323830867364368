"""``vigil endpoint ...`` and ``vigil run ...``: talk to a running gateway from the shell."""

from __future__ import annotations

import argparse
import os
import sys

import grpc
from google.protobuf.duration_pb2 import Duration

from cli.common import UsageError
from rpc.client import sync_channel
from vigil.gateway.v1 import gateway_pb2 as gw
from vigil.gateway.v1 import gateway_pb2_grpc

PROTOCOLS = {
    "vigil": gw.PROTOCOL_VIGIL,
    "kserve_v2": gw.PROTOCOL_KSERVE_V2,
    "openai": gw.PROTOCOL_OPENAI,
}
STATES = {v: k.removeprefix("RUN_STATE_").lower() for k, v in gw.RunState.items()}
TERMINAL = (gw.RUN_STATE_SUCCEEDED, gw.RUN_STATE_FAILED, gw.RUN_STATE_CANCELLED)


def _stub(args: argparse.Namespace) -> gateway_pb2_grpc.GatewayServiceStub:
    return gateway_pb2_grpc.GatewayServiceStub(sync_channel(args.gateway))


def _call(fn, request, timeout: float = 30.0):  # type: ignore[no-untyped-def]
    try:
        return fn(request, timeout=timeout)
    except grpc.RpcError as exc:
        code = exc.code()  # type: ignore[attr-defined]
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            raise UsageError(
                f"the gateway is not reachable ({code.name}: {exc.details()})"
            ) from None  # type: ignore[attr-defined]
        raise UsageError(f"{code.name}: {exc.details()}") from None  # type: ignore[attr-defined]


def _run_line(run: gw.Run) -> str:
    done = f"{run.completed_count}/{run.item_count}"
    line = f"{run.run_id}  {run.endpoint_name:18s} {STATES[run.state]:9s} {done:>11s}  {run.benchmark_id}"
    if run.image_mode == "text_only":
        line += "  (text only)"
    if run.error_message:
        line += f"  -- {run.error_message}"
    return line


def cmd_endpoint_register(args: argparse.Namespace) -> int:
    endpoint = gw.Endpoint(
        name=args.name,
        address=args.address,
        protocol=PROTOCOLS[args.protocol],
        model_name=args.model_name or "",
        model_version=args.model_version or "",
        max_concurrency=args.max_concurrency or 0,
        schedule_benchmark=args.schedule_benchmark or "",
        schedule_interval=Duration(seconds=int(args.schedule_interval_s or 0)),
        request_timeout=Duration(seconds=int(args.request_timeout_s or 0)),
    )
    ep = _call(_stub(args).RegisterEndpoint, gw.RegisterEndpointRequest(endpoint=endpoint)).endpoint
    print(f"registered {ep.name} -> {ep.address}")
    return 0


def cmd_endpoint_list(args: argparse.Namespace) -> int:
    eps = _call(_stub(args).ListEndpoints, gw.ListEndpointsRequest()).endpoints
    if not eps:
        print("no endpoints registered")
    for ep in eps:
        schedule = (
            f"every {ep.schedule_interval.seconds} s on {ep.schedule_benchmark}"
            if ep.schedule_interval.seconds
            else "no schedule"
        )
        protocol = gw.Protocol.Name(ep.protocol).removeprefix("PROTOCOL_").lower()
        print(f"{ep.name:18s} {ep.address:22s} {protocol:10s} {schedule}")
    return 0


def cmd_run_start(args: argparse.Namespace) -> int:
    stub = _stub(args)
    request = gw.StartRunRequest(
        endpoint_name=args.endpoint, benchmark=args.benchmark, text_only=args.text_only
    )
    run = _call(stub.StartRun, request).run
    print(_run_line(run))
    if args.watch:
        return _watch(stub, run.run_id)
    return 0


def _watch(stub: gateway_pb2_grpc.GatewayServiceStub, run_id: str) -> int:
    try:
        for update in stub.WatchRun(gw.WatchRunRequest(run_id=run_id)):
            print(_run_line(update.run), flush=True)
            if update.run.state in TERMINAL:
                return 0 if update.run.state == gw.RUN_STATE_SUCCEEDED else 1
    except grpc.RpcError as exc:
        raise UsageError(f"{exc.code().name}: {exc.details()}") from None  # type: ignore[attr-defined]
    return 1


def cmd_run_watch(args: argparse.Namespace) -> int:
    return _watch(_stub(args), args.run_id)


def cmd_run_list(args: argparse.Namespace) -> int:
    request = gw.ListRunsRequest(endpoint_name=args.endpoint or "", page_size=args.limit)
    runs = _call(_stub(args).ListRuns, request).runs
    if not runs:
        print("no runs yet")
    for run in runs:
        print(_run_line(run))
    return 0


def cmd_run_cancel(args: argparse.Namespace) -> int:
    run = _call(_stub(args).CancelRun, gw.CancelRunRequest(run_id=args.run_id)).run
    print(_run_line(run))
    return 0


def add_client_commands(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    default_gateway = os.environ.get("VIGIL_GATEWAY_ADDRESS", "127.0.0.1:50051")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--gateway",
            default=default_gateway,
            help=f"gateway address (default {default_gateway})",
        )

    endpoint = commands.add_parser("endpoint", help="register and list model endpoints")
    ep_cmds = endpoint.add_subparsers(dest="endpoint_command", metavar="ACTION", required=True)
    reg = ep_cmds.add_parser("register", help="add or replace an endpoint")
    reg.add_argument("name")
    reg.add_argument("address", help="host:port of the model server")
    reg.add_argument("--protocol", choices=sorted(PROTOCOLS), default="vigil")
    reg.add_argument("--model-name", help="the model to address (kserve_v2, openai)")
    reg.add_argument("--model-version", help="the model version to pin (kserve_v2)")
    reg.add_argument("--max-concurrency", type=int, help="requests in flight")
    reg.add_argument("--request-timeout-s", type=float, help="deadline per request")
    reg.add_argument("--schedule-interval-s", type=float, help="audit every N seconds")
    reg.add_argument("--schedule-benchmark", help="the benchmark scheduled runs replay")
    common(reg)
    reg.set_defaults(handler=cmd_endpoint_register)
    lst = ep_cmds.add_parser("list", help="list endpoints")
    common(lst)
    lst.set_defaults(handler=cmd_endpoint_list)

    run = commands.add_parser("run", help="start, watch, list and cancel audit runs")
    run_cmds = run.add_subparsers(dest="run_command", metavar="ACTION", required=True)
    start = run_cmds.add_parser("start", help="replay a benchmark against an endpoint")
    start.add_argument("endpoint")
    start.add_argument("benchmark", help="a benchmark name, id or path")
    start.add_argument("--text-only", action="store_true", help="send no images")
    start.add_argument("--watch", action="store_true", help="follow the run until it ends")
    common(start)
    start.set_defaults(handler=cmd_run_start)
    watch = run_cmds.add_parser("watch", help="follow a run until it ends")
    watch.add_argument("run_id")
    common(watch)
    watch.set_defaults(handler=cmd_run_watch)
    rl = run_cmds.add_parser("list", help="list runs, newest first")
    rl.add_argument("--endpoint", help="only this endpoint's runs")
    rl.add_argument("--limit", type=int, default=20)
    common(rl)
    rl.set_defaults(handler=cmd_run_list)
    cancel = run_cmds.add_parser("cancel", help="cancel a run")
    cancel.add_argument("run_id")
    common(cancel)
    cancel.set_defaults(handler=cmd_run_cancel)


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use the vigil command")
