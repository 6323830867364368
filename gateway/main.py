"""``vigil serve gateway``: the gateway process."""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path

import grpc
from prometheus_client import start_http_server

from gateway.metrics import GatewayMetrics
from gateway.recorder import Recorder
from gateway.runs import RunManager
from gateway.servicer import GatewayServicer
from gateway.settings import GatewaySettings
from gateway.store import GatewayStore
from rpc.server import graceful_stop, install_stop_signals, start_server, write_ready_file
from vigil.gateway.v1 import gateway_pb2, gateway_pb2_grpc

log = logging.getLogger("vigil.gateway")

SERVICE_NAME = gateway_pb2.DESCRIPTOR.services_by_name["GatewayService"].full_name


async def serve(settings: GatewaySettings, stop: asyncio.Event | None = None) -> None:
    """Run the gateway until ``stop`` is set (or SIGTERM / SIGINT)."""
    stop = stop or asyncio.Event()
    try:
        install_stop_signals(stop)
    except (RuntimeError, ValueError):  # not the main thread (tests run it in-process)
        pass
    store = GatewayStore(settings.db_path)
    metrics = GatewayMetrics()
    recorder = Recorder(store)
    recorder.start()
    runs = RunManager(store, recorder, settings, metrics)
    servicer = GatewayServicer(runs)

    def register(server: grpc.aio.Server) -> None:
        gateway_pb2_grpc.add_GatewayServiceServicer_to_server(servicer, server)

    running = await start_server(settings.host, settings.port, register, [SERVICE_NAME])
    metrics_server, _ = start_http_server(settings.metrics_port, settings.host, metrics.registry)
    metrics_port = metrics_server.server_port
    await runs.resume()
    runs.start_scheduler()
    await running.set_serving(True)
    write_ready_file(
        str(settings.ready_file) if settings.ready_file else None,
        {"grpc_port": running.port, "metrics_port": metrics_port},
    )
    log.info("gateway listening on %s:%d, metrics on %d, log at %s",
             settings.host, running.port, metrics_port, settings.db_path)  # fmt: skip
    try:
        await stop.wait()
    finally:
        log.info("gateway stopping")
        await servicer.stop_streams()
        await graceful_stop(running)
        await runs.shutdown()
        metrics_server.shutdown()
        store.close()


def add_serve_gateway_command(serve: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = serve.add_parser("gateway", help="the gateway: endpoints, runs, the response log")
    p.add_argument("--host", help="interface to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="gRPC port (default 50051; 0 = any)")
    p.add_argument("--metrics-port", type=int, help="Prometheus port (default 9101; 0 = any)")
    p.add_argument("--db-path", type=Path, help="the DuckDB file (default var/gateway.duckdb)")
    p.add_argument("--benchmark-root", type=Path, help="benchmark folders (default var/benchmarks)")
    p.add_argument("--max-concurrency", type=int, help="requests in flight per endpoint")
    p.add_argument("--request-timeout-s", type=float, help="deadline per model request")
    p.add_argument("--max-attempts", type=int, help="attempts per item on UNAVAILABLE (default 3)")
    p.add_argument(
        "--max-pause-s", type=float, help="how long a run waits for its endpoint (default 300)"
    )
    p.add_argument("--error-budget", type=float, help="share of failed items that fails a run")
    p.add_argument("--ready-file", type=Path, help="write the bound ports here as JSON")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from cli.common import settings_from_args

    settings = settings_from_args(GatewaySettings, args)
    asyncio.run(serve(settings))
    return 0
