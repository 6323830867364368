"""``vigil serve grader``: the grader process."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from pathlib import Path

import grpc
from prometheus_client import start_http_server

from grader.exporter import GraderExporter
from grader.pipeline import Grader, follow
from grader.servicer import GraderServicer
from grader.settings import GraderSettings
from grader.store import GraderStore
from rpc.server import graceful_stop, install_stop_signals, start_server, write_ready_file
from vigil.grader.v1 import grader_pb2, grader_pb2_grpc

log = logging.getLogger("vigil.grader")

SERVICE_NAME = grader_pb2.DESCRIPTOR.services_by_name["GraderService"].full_name


async def serve(settings: GraderSettings, stop: asyncio.Event | None = None) -> None:
    """Run the grader until ``stop`` is set (or SIGTERM / SIGINT)."""
    stop = stop or asyncio.Event()
    with contextlib.suppress(RuntimeError, ValueError):
        install_stop_signals(stop)
    store = GraderStore(settings.db_path)
    exporter = GraderExporter()
    grader = Grader(store, settings, exporter)
    exporter.refresh(store)
    exporter.last_seq.set(store.last_seq)

    def register(server: grpc.aio.Server) -> None:
        grader_pb2_grpc.add_GraderServiceServicer_to_server(GraderServicer(grader), server)

    running = await start_server(settings.host, settings.port, register, [SERVICE_NAME])
    metrics_server, _ = start_http_server(settings.metrics_port, settings.host, exporter.registry)
    metrics_port = metrics_server.server_port
    follower = asyncio.create_task(follow(grader, settings, stop), name="follow")
    await running.set_serving(True)
    write_ready_file(
        str(settings.ready_file) if settings.ready_file else None,
        {"grpc_port": running.port, "metrics_port": metrics_port},
    )
    log.info("grader listening on %s:%d, metrics on %d, following %s from seq %d",
             settings.host, running.port, metrics_port, settings.gateway_address,
             store.last_seq)  # fmt: skip
    try:
        await stop.wait()
    finally:
        log.info("grader stopping")
        await graceful_stop(running)
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
        metrics_server.shutdown()
        store.close()


def add_serve_grader_command(serve: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = serve.add_parser("grader", help="the grader: follows the gateway's log, serves figures")
    p.add_argument("--host", help="interface to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="gRPC port (default 50052; 0 = any)")
    p.add_argument("--metrics-port", type=int, help="Prometheus port (default 9102; 0 = any)")
    p.add_argument("--gateway-address", help="the gateway to follow (default 127.0.0.1:50051)")
    p.add_argument("--db-path", type=Path, help="the DuckDB file (default var/grader.duckdb)")
    p.add_argument("--benchmark-root", type=Path, help="benchmark folders (default var/benchmarks)")
    p.add_argument("--bootstrap-resamples", type=int, help="bootstrap resamples (default 1000)")
    p.add_argument("--ready-file", type=Path, help="write the bound ports here as JSON")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from cli.common import settings_from_args

    settings = settings_from_args(GraderSettings, args)
    asyncio.run(serve(settings))
    return 0
