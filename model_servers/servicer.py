"""``vigil.model.v1.ModelService`` over the runtime: convert, delegate, count.

Errors are ``rpc.errors`` exceptions; the server's interceptor maps them to status codes.
Logs carry request ids and outcomes only, never prompt text or image content.
"""

from __future__ import annotations

import logging

import grpc

from model_servers import convert
from model_servers.metrics import ModelMetrics
from model_servers.runtime import ModelRuntime
from rpc.errors import VigilError
from vigil.model.v1 import model_pb2, model_pb2_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = model_pb2.DESCRIPTOR.services_by_name["ModelService"].full_name


class ModelServicer(model_pb2_grpc.ModelServiceServicer):
    """Serves one runtime's model."""

    def __init__(
        self, runtime: ModelRuntime, metrics: ModelMetrics, default_max_new_tokens: int
    ) -> None:
        self._runtime = runtime
        self._metrics = metrics
        self._default_max_new_tokens = default_max_new_tokens

    async def Generate(  # noqa: N802 - gRPC method name
        self, request: model_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> model_pb2.GenerateResponse:
        try:
            generation = await self._runtime.generate(
                convert.generation_input(request, self._default_max_new_tokens),
                timeout_s=context.time_remaining(),
            )
        except VigilError as exc:
            self._metrics.request(exc.code.name)
            log.info("generate request_id=%s code=%s", request.request_id, exc.code.name)
            raise
        except Exception:
            self._metrics.request(grpc.StatusCode.INTERNAL.name)
            raise
        self._metrics.request(grpc.StatusCode.OK.name)
        self._metrics.latency(generation.latency_s)
        log.info(
            "generate request_id=%s code=OK images=%d completion_tokens=%d latency_ms=%.1f",
            request.request_id,
            len(request.images),
            generation.output.completion_token_count,
            generation.latency_s * 1000,
        )
        return convert.generate_response(generation)

    async def DescribeModel(  # noqa: N802 - gRPC method name
        self, request: model_pb2.DescribeModelRequest, context: grpc.aio.ServicerContext
    ) -> model_pb2.DescribeModelResponse:
        return convert.describe_response(self._runtime.describe(), self._runtime.backend.name)


def add_to_server(servicer: ModelServicer, server: grpc.aio.Server) -> None:
    """Register ``servicer`` on ``server``."""
    model_pb2_grpc.add_ModelServiceServicer_to_server(servicer, server)
