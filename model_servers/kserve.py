"""KServe v2 / Triton ``inference.GRPCInferenceService`` over the same runtime as ModelService.

The stubs are the ones ``tritonclient`` ships (package ``inference``, the exact wire path Triton
clients call). The servicer converts tensors (``model_servers.kserve_convert``), checks the model
name and version, and delegates to ``ModelRuntime``; errors are ``rpc.errors`` exceptions that
the server's interceptor maps to status codes (a bad tensor INVALID_ARGUMENT, an unknown model or
version NOT_FOUND, a model still loading UNAVAILABLE). Logs carry request ids, never content.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from cli.version import VIGIL_VERSION
from model_servers import kserve_convert as convert
from model_servers.backends.base import ModelInfo
from model_servers.metrics import ModelMetrics
from model_servers.runtime import ModelRuntime
from rpc.errors import InvalidArgument, VigilError

log = logging.getLogger(__name__)


class Unimplemented(VigilError):
    """An RPC of the Triton protocol that this server does not serve (shared memory, tracing)."""

    code = grpc.StatusCode.UNIMPLEMENTED


SERVICE_NAME = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name


class KServeServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    """The Triton protocol for one runtime's model; unimplemented RPCs answer UNIMPLEMENTED."""

    def __init__(
        self, runtime: ModelRuntime, metrics: ModelMetrics, default_max_new_tokens: int
    ) -> None:
        self._runtime = runtime
        self._metrics = metrics
        self._default_max_new_tokens = default_max_new_tokens

    def _loaded(self) -> ModelInfo:
        return self._runtime.loaded()

    async def ServerLive(  # noqa: N802 - gRPC method name
        self, request: service_pb2.ServerLiveRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.ServerLiveResponse:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(  # noqa: N802
        self, request: service_pb2.ServerReadyRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.ServerReadyResponse:
        return service_pb2.ServerReadyResponse(ready=self._runtime.ready)

    async def ServerMetadata(  # noqa: N802
        self, request: service_pb2.ServerMetadataRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.ServerMetadataResponse:
        return service_pb2.ServerMetadataResponse(
            name="vigil", version=VIGIL_VERSION, extensions=["model_configuration"]
        )

    async def ModelReady(  # noqa: N802
        self, request: service_pb2.ModelReadyRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.ModelReadyResponse:
        info = self._runtime.describe()
        if info is None:  # the name is not known until the model has loaded
            return service_pb2.ModelReadyResponse(ready=False)
        convert.check_model(info, request.name, request.version)
        return service_pb2.ModelReadyResponse(ready=True)

    async def ModelMetadata(  # noqa: N802
        self, request: service_pb2.ModelMetadataRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.ModelMetadataResponse:
        info = self._loaded()
        convert.check_model(info, request.name, request.version)
        return convert.model_metadata(info)

    async def ModelConfig(  # noqa: N802
        self, request: service_pb2.ModelConfigRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.ModelConfigResponse:
        info = self._loaded()
        convert.check_model(info, request.name, request.version)
        return service_pb2.ModelConfigResponse(config=convert.model_config(info))

    async def RepositoryIndex(  # noqa: N802
        self, request: service_pb2.RepositoryIndexRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.RepositoryIndexResponse:
        info = self._runtime.describe()
        if info is None:
            return service_pb2.RepositoryIndexResponse()
        return service_pb2.RepositoryIndexResponse(
            models=[
                service_pb2.RepositoryIndexResponse.ModelIndex(
                    name=info.model_name, version=convert.triton_version(info), state="READY"
                )
            ]
        )

    async def ModelInfer(  # noqa: N802
        self, request: service_pb2.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.ModelInferResponse:
        try:
            response = await self._infer(request, context.time_remaining())
        except VigilError as exc:
            self._metrics.request(exc.code.name)
            log.info("infer request_id=%s code=%s", request.id, exc.code.name)
            raise
        except Exception:
            self._metrics.request(grpc.StatusCode.INTERNAL.name)
            raise
        self._metrics.request(grpc.StatusCode.OK.name)
        return response

    async def ModelStreamInfer(  # noqa: N802
        self,
        request_iterator: AsyncIterator[service_pb2.ModelInferRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[service_pb2.ModelStreamInferResponse]:
        """Each request gets one response (or an ``error_message``), as a decoupled Triton model
        with ``stream`` false answers; the stream stays open after a failed request."""
        async for request in request_iterator:
            try:
                response = await self.ModelInfer(request, context)
            except VigilError as exc:
                yield service_pb2.ModelStreamInferResponse(error_message=exc.message)
                continue
            except Exception:
                log.exception("stream infer request_id=%s failed", request.id)
                yield service_pb2.ModelStreamInferResponse(error_message="internal error")
                continue
            response.parameters["triton_final_response"].bool_param = True
            yield service_pb2.ModelStreamInferResponse(infer_response=response)

    async def _infer(
        self, request: service_pb2.ModelInferRequest, timeout_s: float | None = None
    ) -> service_pb2.ModelInferResponse:
        info = self._loaded()
        convert.check_model(info, request.model_name, request.model_version)
        decoded = convert.infer_request(request, self._default_max_new_tokens)
        try:
            generation = await self._runtime.generate(decoded.generation, timeout_s=timeout_s)
        except InvalidArgument as exc:
            tensor = convert.tensor_name_for(exc.message)
            raise InvalidArgument(f"input {tensor!r}: {exc.message}") from None
        self._metrics.latency(generation.latency_s)
        log.info(
            "infer request_id=%s code=OK images=%d completion_tokens=%d latency_ms=%.1f",
            request.id,
            len(decoded.generation.images),
            generation.output.completion_token_count,
            generation.latency_s * 1000,
        )
        return convert.infer_response(request, decoded, generation)


def _unimplemented(name: str) -> Any:
    async def method(self: KServeServicer, request: Any, context: grpc.aio.ServicerContext) -> Any:
        raise Unimplemented(f"{name} is not served by this server")

    method.__name__ = name
    return method


for _method in service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
    if _method.name not in KServeServicer.__dict__ and not _method.client_streaming:
        setattr(KServeServicer, _method.name, _unimplemented(_method.name))


def add_to_server(servicer: KServeServicer, server: grpc.aio.Server) -> None:
    """Register ``servicer`` on ``server``."""
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
