"""Start a Vigil gRPC server the same way everywhere.

Every server gets ``grpc.health.v1`` (NOT_SERVING until the service says it is ready), reflection,
explicit message-size limits, the error-mapping interceptor, and a graceful stop on SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from rpc.errors import VigilError

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
SERVER_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
]


def _status_of(exc: BaseException, method: str) -> tuple[grpc.StatusCode, str]:
    if isinstance(exc, VigilError):
        return exc.code, exc.message
    log.exception("unhandled error in %s", method)
    return grpc.StatusCode.INTERNAL, "internal error"


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Map ``VigilError`` to its status and anything unexpected to a generic INTERNAL."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        if handler.unary_unary is not None:
            inner_uu = handler.unary_unary

            async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                try:
                    return await inner_uu(request, context)
                except (asyncio.CancelledError, grpc.aio.AbortError):
                    raise
                except Exception as exc:  # noqa: BLE001 - this is the one mapping point
                    code, message = _status_of(exc, method)
                    await context.abort(code, message)

            return grpc.unary_unary_rpc_method_handler(
                unary_unary,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            inner_us = handler.unary_stream

            async def unary_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
                try:
                    async for item in inner_us(request, context):
                        yield item
                except (asyncio.CancelledError, grpc.aio.AbortError):
                    raise
                except Exception as exc:  # noqa: BLE001
                    code, message = _status_of(exc, method)
                    await context.abort(code, message)

            return grpc.unary_stream_rpc_method_handler(
                unary_stream,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler


@dataclass
class RunningServer:
    """A started server, its bound port, and its health servicer."""

    server: grpc.aio.Server
    port: int
    health: Any
    service_names: Sequence[str]

    async def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", *self.service_names):
            await _set_health(self.health, name, status)


async def _set_health(servicer: Any, name: str, status: int) -> None:
    result = servicer.set(name, status)
    if asyncio.iscoroutine(result):
        await result


async def start_server(
    host: str,
    port: int,
    register: Callable[[grpc.aio.Server], None],
    service_names: Sequence[str],
) -> RunningServer:
    """Create, wire and start a server; ``port`` 0 lets the OS choose. Health starts NOT_SERVING."""
    server = grpc.aio.server(interceptors=[ErrorInterceptor()], options=SERVER_OPTIONS)
    register(server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        [
            *service_names,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ],
        server,
    )
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError as exc:  # grpcio >= 1.5x raises instead of returning 0
        raise OSError(f"cannot listen on {host}:{port}") from exc
    if bound == 0:
        raise OSError(f"cannot listen on {host}:{port}")
    await server.start()
    running = RunningServer(server, bound, health_servicer, service_names)
    await running.set_serving(False)
    return running


def install_stop_signals(stop: asyncio.Event) -> None:
    """Set ``stop`` on SIGTERM or SIGINT so that ``main`` can drain and exit cleanly."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


async def graceful_stop(running: RunningServer, grace_s: float = 5.0) -> None:
    """Report NOT_SERVING, stop accepting calls, and let in-flight calls finish within the grace."""
    await running.set_serving(False)
    await running.server.stop(grace_s)


def write_ready_file(path: str | None, ports: dict[str, int]) -> None:
    """Write the bound ports as JSON, atomically, for a parent that started this process on port 0."""
    if not path:
        return
    import json
    import os

    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(ports, fh)
    os.replace(tmp, path)
