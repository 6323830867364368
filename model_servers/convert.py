"""Protobuf <-> domain conversions for ``vigil.model.v1``; no logic beyond field mapping."""

from __future__ import annotations

from google.protobuf.duration_pb2 import Duration

from model_servers.backends.base import FinishReason, GenerationInput, ModelInfo
from model_servers.runtime import Generation
from rpc.errors import InvalidArgument
from vigil.model.v1 import model_pb2

_FINISH_REASONS: dict[FinishReason, int] = {
    "stop": model_pb2.FINISH_REASON_STOP,
    "length": model_pb2.FINISH_REASON_LENGTH,
}


def generation_input(
    request: model_pb2.GenerateRequest, default_max_new_tokens: int
) -> GenerationInput:
    """The domain request; ``max_new_tokens`` 0 means the server's default."""
    max_new_tokens = request.parameters.max_new_tokens
    if max_new_tokens < 0:
        raise InvalidArgument(
            f"parameters.max_new_tokens must not be negative, got {max_new_tokens}"
        )
    return GenerationInput(
        images=[image.data for image in request.images],
        media_types=[image.media_type for image in request.images],
        prompt=request.prompt,
        max_new_tokens=max_new_tokens or default_max_new_tokens,
        return_logprobs=request.return_logprobs,
        request_id=request.request_id,
    )


def generate_response(generation: Generation) -> model_pb2.GenerateResponse:
    """The protobuf answer for a finished generation."""
    output, info = generation.output, generation.info
    latency = Duration()
    latency.FromNanoseconds(round(generation.latency_s * 1e9))
    return model_pb2.GenerateResponse(
        text=output.text,
        prompt_token_count=output.prompt_token_count,
        completion_token_count=output.completion_token_count,
        latency=latency,
        finish_reason=_FINISH_REASONS.get(
            output.finish_reason, model_pb2.FINISH_REASON_UNSPECIFIED
        ),
        model_name=info.model_name,
        model_version=info.model_version,
        logprobs=[model_pb2.TokenLogprob(token=t, logprob=lp) for t, lp in output.logprobs],
    )


def describe_response(info: ModelInfo | None, backend: str) -> model_pb2.DescribeModelResponse:
    """The protobuf description; ``info`` None means the model is still loading."""
    if info is None:
        return model_pb2.DescribeModelResponse(backend=backend, ready=False)
    return model_pb2.DescribeModelResponse(
        model_name=info.model_name,
        model_version=info.model_version,
        backend=info.backend,
        ready=True,
        supports_logprobs=info.supports_logprobs,
    )
