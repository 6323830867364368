"""Run one model server: ``vigil serve model`` (or ``python -m model_servers.main``).

One gRPC port serves Vigil's ModelService and the KServe v2 / Triton GRPCInferenceService; with
``--openai-port`` an OpenAI-compatible HTTP endpoint runs on the same event loop.

Flow: start gRPC (health NOT_SERVING) -> start metrics -> write the ready file -> load the backend
in a thread -> SERVING -> wait for SIGTERM/SIGINT -> NOT_SERVING and a graceful stop. A model that
cannot load ends the process with one line on stderr that names the path, and a non-zero status.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from model_servers import kserve
from model_servers.backends import BACKENDS, UnknownBackend, create_backend
from model_servers.backends.base import Backend, BackendLoadError
from model_servers.metrics import ModelMetrics, start_metrics_server, stop_metrics_server
from model_servers.openai_http import build_app, start_openai_server
from model_servers.runtime import ModelRuntime
from model_servers.servicer import SERVICE_NAME, ModelServicer, add_to_server
from model_servers.settings import ModelServerSettings
from rpc.server import graceful_stop, install_stop_signals, start_server, write_ready_file

log = logging.getLogger("model_servers")

PROG = "vigil serve model"


async def serve(
    settings: ModelServerSettings,
    *,
    backend: Backend | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve until ``stop`` is set (by default: until SIGTERM or SIGINT).

    ``backend`` replaces the one the settings name (tests pass their own). Raises
    ``BackendLoadError`` when the model cannot load, after the server has stopped.
    """
    if backend is None:
        backend = create_backend(settings.backend, settings.backend_settings())
    if stop is None:
        stop = asyncio.Event()
        install_stop_signals(stop)
    registry = CollectorRegistry()
    metrics = ModelMetrics(registry, backend.name)
    runtime = ModelRuntime(backend, max_images=settings.max_images, batching=settings.batching())
    servicer = ModelServicer(runtime, metrics, settings.max_new_tokens)
    kserve_servicer = kserve.KServeServicer(runtime, metrics, settings.max_new_tokens)

    def register(server: Any) -> None:
        add_to_server(servicer, server)
        kserve.add_to_server(kserve_servicer, server)

    running = await start_server(
        settings.host, settings.port, register, [SERVICE_NAME, kserve.SERVICE_NAME]
    )
    metrics_server = None
    http_runner = None
    pending: list[asyncio.Future[Any]] = []
    try:
        metrics_server, metrics_port = start_metrics_server(
            registry, settings.host, settings.metrics_port
        )
        ports = {"grpc_port": running.port, "metrics_port": metrics_port}
        if settings.openai_port is not None:
            app = build_app(runtime, metrics, settings.max_new_tokens)
            http_runner, ports["openai_port"] = await start_openai_server(
                app, settings.host, settings.openai_port
            )
        log.info(
            "model server backend=%s grpc=%s:%d metrics=%d openai=%s; loading",
            backend.name,
            settings.host,
            running.port,
            metrics_port,
            ports.get("openai_port", "off"),
        )
        write_ready_file(str(settings.ready_file) if settings.ready_file else None, ports)
        load = asyncio.ensure_future(runtime.load())
        stopped = asyncio.ensure_future(stop.wait())
        pending += [load, stopped]
        await asyncio.wait({load, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if load.done():
            load.result()  # raises the load error, if any
            await running.set_serving(True)
            metrics.set_ready(True)
            log.info("serving")
            await stopped
        else:
            log.info("stop requested while loading")
            load.cancel()
        log.info("stopping")
    finally:
        for task in pending:
            task.cancel()
        metrics.set_ready(False)
        if http_runner is not None:
            await http_runner.cleanup()
        await graceful_stop(running)
        runtime.close()
        if metrics_server is not None:
            stop_metrics_server(metrics_server)


def _configure_logging() -> None:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )


def _error(message: str) -> None:
    print(f"{PROG}: error: {message}", file=sys.stderr)


def run(settings: ModelServerSettings) -> int:
    """Serve in a fresh event loop; the process exit status."""
    _configure_logging()
    try:
        asyncio.run(serve(settings))
    except (BackendLoadError, UnknownBackend) as exc:
        _error(str(exc))
        return 1
    except OSError as exc:  # a port that cannot be bound
        _error(f"cannot start: {exc}")
        return 1
    return 0


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``serve model``; each overrides its ``VIGIL_MODEL_*`` variable."""
    parser.add_argument("--backend", choices=sorted(BACKENDS), help="backend (default: random)")
    parser.add_argument("--model-path", type=Path, help="local Hugging Face model folder (hf)")
    parser.add_argument("--model-name", help="served model name override")
    parser.add_argument("--host", help="listen address (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, help="gRPC port; 0 lets the OS choose (default: 50061)")
    parser.add_argument("--metrics-port", type=int, help="Prometheus port; 0 lets the OS choose")
    parser.add_argument(
        "--openai-port",
        type=int,
        help="also serve OpenAI-compatible HTTP on this port; 0 lets the OS choose (default: off)",
    )
    parser.add_argument("--seed", type=int, help="seed of the random baseline (default: 0)")
    parser.add_argument("--max-new-tokens", type=int, help="default new-token limit (default: 32)")
    parser.add_argument(
        "--latency-ms", type=float, help="simulated per-request latency of the random baseline"
    )
    parser.add_argument("--torch-threads", type=int, help="torch CPU threads for hf (0: default)")
    parser.add_argument(
        "--max-batch-size", type=int, help="most requests per generation call (default: 8)"
    )
    parser.add_argument(
        "--max-queue-delay-ms", type=float, help="wait for a batch to fill (default: 10)"
    )
    parser.add_argument(
        "--max-queue-size", type=int, help="waiting requests before RESOURCE_EXHAUSTED"
    )
    parser.add_argument("--ready-file", type=Path, help="write the bound ports here as JSON")


_SETTING_FLAGS = (
    "backend",
    "model_path",
    "model_name",
    "host",
    "port",
    "metrics_port",
    "openai_port",
    "seed",
    "max_new_tokens",
    "torch_threads",
    "latency_ms",
    "max_batch_size",
    "max_queue_delay_ms",
    "max_queue_size",
    "ready_file",
)


def settings_from_args(args: argparse.Namespace) -> ModelServerSettings:
    """Environment settings with the flags given on the command line on top."""
    overrides = {
        name: getattr(args, name)
        for name in _SETTING_FLAGS
        if getattr(args, name, None) is not None
    }
    return ModelServerSettings(**overrides)


def _serve_handler(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_args(args)
    except ValidationError as exc:
        _error(f"invalid settings: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}")
        return 2
    return run(settings)


def add_serve_model_command(subparsers: argparse._SubParsersAction) -> None:
    """Add ``model`` to the ``vigil serve`` group."""
    parser = subparsers.add_parser(
        "model",
        help="serve a model over Vigil's ModelService and KServe v2 (gRPC), optionally OpenAI HTTP",
        description="Serve one model over vigil.model.v1.ModelService and the KServe v2 / Triton "
        "inference.GRPCInferenceService on one port, with health and metrics; --openai-port adds "
        "an OpenAI-compatible HTTP endpoint.",
    )
    add_serve_arguments(parser)
    parser.set_defaults(handler=_serve_handler)


def _build_tiny_handler(args: argparse.Namespace) -> int:
    from model_servers.tiny import ensure_tiny_llava

    try:
        path = ensure_tiny_llava(args.path, seed=args.seed)
    except (FileExistsError, OSError) as exc:
        print(f"vigil model build-tiny: error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


def add_model_commands(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``vigil model`` group: ``vigil model build-tiny PATH``."""
    parser = subparsers.add_parser("model", help="model tools")
    commands = parser.add_subparsers(dest="model_command", required=True)
    build = commands.add_parser(
        "build-tiny",
        help="build a tiny random-weight LLaVA model for tests (if missing)",
    )
    build.add_argument("path", type=Path, help="folder to create")
    build.add_argument("--seed", type=int, default=0, help="weight seed (default: 0)")
    build.set_defaults(handler=_build_tiny_handler)


def main(argv: list[str] | None = None) -> int:
    """``python -m model_servers.main``: the same flags as ``vigil serve model``."""
    parser = argparse.ArgumentParser(prog="python -m model_servers.main")
    add_serve_arguments(parser)
    return _serve_handler(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
