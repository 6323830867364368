"""Adapter for Vigil's own ``vigil.model.v1.ModelService``."""

from __future__ import annotations

import grpc

from gateway.adapters.base import AdapterError, AdapterTarget, ModelIdentity, ModelReply
from rpc.client import aio_channel
from rpc.errors import RETRYABLE_CODES
from vigil.model.v1 import model_pb2, model_pb2_grpc


def _error(exc: grpc.aio.AioRpcError) -> AdapterError:
    code = exc.code()
    return AdapterError(
        f"{code.name}: {exc.details() or 'no details'}",
        timeout=code == grpc.StatusCode.DEADLINE_EXCEEDED,
        retryable=code in RETRYABLE_CODES,
    )


class VigilAdapter:
    """Calls ``ModelService`` over one shared asyncio channel."""

    protocol = "vigil"

    def __init__(self, target: AdapterTarget) -> None:
        self.address = target.address
        self._channel = aio_channel(target.address)
        self._stub = model_pb2_grpc.ModelServiceStub(self._channel)

    async def describe(self, timeout_s: float) -> ModelIdentity:
        try:
            reply = await self._stub.DescribeModel(
                model_pb2.DescribeModelRequest(), timeout=timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            raise _error(exc) from None
        return ModelIdentity(reply.model_name, reply.model_version, reply.ready)

    async def generate(
        self,
        images: list[tuple[bytes, str]],
        prompt: str,
        request_id: str,
        timeout_s: float,
    ) -> ModelReply:
        request = model_pb2.GenerateRequest(
            images=[model_pb2.Image(data=data, media_type=media) for data, media in images],
            prompt=prompt,
            request_id=request_id,
            return_logprobs=True,
        )
        try:
            reply = await self._stub.Generate(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise _error(exc) from None
        return ModelReply(
            reply.text,
            reply.model_name,
            reply.model_version,
            logprobs=tuple((t.token, t.logprob) for t in reply.logprobs),
        )

    async def close(self) -> None:
        await self._channel.close()
