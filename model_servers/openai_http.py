"""An OpenAI-compatible HTTP endpoint over the same runtime: Chat Completions and the model list.

``POST /v1/chat/completions`` takes the messages of a chat (text parts and images as data URLs in
``image_url`` parts), runs one generation and answers as OpenAI's API does; ``logprobs: true``
returns the backend's per-token log-probabilities when it offers them. ``GET /v1/models`` lists
the served model (an empty list while it loads is not given: the server answers 503 instead).
The served model's version is the answer's ``system_fingerprint``.

Errors are OpenAI-style JSON (``{"error": {"message", "type", "code"}}``) with the HTTP status of
the ``rpc.errors`` class: 400 bad input, 404 unknown model, 503 still loading, 429 full, 500 for
anything unexpected (with a generic message). It runs on the gRPC server's event loop.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import time
import uuid
from typing import Any

import grpc
from aiohttp import web

from model_servers.backends.base import GenerationInput, ModelInfo
from model_servers.metrics import ModelMetrics
from model_servers.runtime import Generation, ModelRuntime
from rpc.errors import InvalidArgument, NotFound, VigilError
from rpc.server import MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)

_HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error"),
    grpc.StatusCode.NOT_FOUND: (404, "not_found_error"),
    grpc.StatusCode.UNAVAILABLE: (503, "service_unavailable"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "timeout"),
}


def error_response(status: int, kind: str, message: str, code: str | None = None) -> web.Response:
    """An OpenAI-style error body."""
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return web.json_response(body, status=status)


def _from_vigil(exc: VigilError) -> web.Response:
    status, kind = _HTTP_STATUS.get(exc.code, (500, "internal_error"))
    code = "model_not_found" if exc.code == grpc.StatusCode.NOT_FOUND else None
    return error_response(status, kind, exc.message, code)


def _image(url: str, index: int) -> tuple[bytes, str]:
    """The bytes and media type of a ``data:image/...;base64,`` URL."""
    if not url.startswith("data:"):
        raise InvalidArgument(
            f"image {index}: only data URLs (data:image/...;base64,...) are served"
        )
    header, sep, payload = url.partition(",")
    if not sep or not header.endswith(";base64"):
        raise InvalidArgument(f"image {index}: the data URL is not base64")
    media_type = header[len("data:") : -len(";base64")]
    try:
        return base64.b64decode(payload, validate=True), media_type
    except (binascii.Error, ValueError):
        raise InvalidArgument(f"image {index}: the data URL is not valid base64") from None


def _positive_int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(f"{key} must be a positive integer, got {value!r}")
    return value


def generation_input(body: Any, default_max_tokens: int, request_id: str = "") -> GenerationInput:
    """The domain request for a Chat Completions body: text parts joined by newlines, images in
    the order they appear."""
    if not isinstance(body, dict):
        raise InvalidArgument("the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidArgument("messages must be a non-empty list")
    texts: list[str] = []
    images: list[bytes] = []
    media_types: list[str] = []
    for m, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidArgument(f"messages[{m}] must be an object")
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
            continue
        if not isinstance(content, list):
            raise InvalidArgument(f"messages[{m}].content must be a string or a list of parts")
        for p, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif kind == "image_url":
                url = part.get("image_url")
                url = url.get("url") if isinstance(url, dict) else url
                if not isinstance(url, str):
                    raise InvalidArgument(f"messages[{m}].content[{p}].image_url.url is missing")
                data, media_type = _image(url, len(images))
                images.append(data)
                media_types.append(media_type)
            else:
                raise InvalidArgument(f"messages[{m}].content[{p}] is not a text or image_url part")
    max_tokens = _positive_int(body, "max_completion_tokens") or _positive_int(body, "max_tokens")
    return GenerationInput(
        images=images,
        media_types=media_types,
        prompt="\n".join(texts),
        max_new_tokens=max_tokens or default_max_tokens,
        return_logprobs=bool(body.get("logprobs", False)),
        request_id=request_id,
    )


def completion_body(generation: Generation, want_logprobs: bool) -> dict[str, Any]:
    """The Chat Completions answer for a finished generation."""
    output, info = generation.output, generation.info
    logprobs = None
    if want_logprobs:
        logprobs = {
            "content": [
                {
                    "token": token,
                    "logprob": value,
                    "bytes": list(token.encode("utf-8")),
                    "top_logprobs": [],
                }
                for token, value in output.logprobs
            ]
        }
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": info.model_name,
        "system_fingerprint": info.model_version,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": output.text},
                "finish_reason": output.finish_reason,
                "logprobs": logprobs,
            }
        ],
        "usage": {
            "prompt_tokens": output.prompt_token_count,
            "completion_tokens": output.completion_token_count,
            "total_tokens": output.prompt_token_count + output.completion_token_count,
        },
    }


def model_entry(info: ModelInfo) -> dict[str, Any]:
    """One entry of ``GET /v1/models``."""
    return {
        "id": info.model_name,
        "object": "model",
        "created": 0,
        "owned_by": "vigil",
        "root": info.model_name,
        "version": info.model_version,
        "backend": info.backend,
    }


class OpenAIHandlers:
    """The routes, over one runtime."""

    def __init__(
        self, runtime: ModelRuntime, metrics: ModelMetrics, default_max_new_tokens: int
    ) -> None:
        self._runtime = runtime
        self._metrics = metrics
        self._default_max_new_tokens = default_max_new_tokens

    def _loaded(self) -> ModelInfo:
        return self._runtime.loaded()

    async def models(self, request: web.Request) -> web.Response:
        try:
            info = self._loaded()
        except VigilError as exc:
            return _from_vigil(exc)
        return web.json_response({"object": "list", "data": [model_entry(info)]})

    async def chat_completions(self, request: web.Request) -> web.Response:
        try:
            body = await self._complete(request)
        except VigilError as exc:
            self._metrics.request(exc.code.name)
            log.info("chat code=%s", exc.code.name)
            return _from_vigil(exc)
        except Exception:
            self._metrics.request(grpc.StatusCode.INTERNAL.name)
            log.exception("chat completion failed")
            return error_response(500, "internal_error", "internal error")
        self._metrics.request(grpc.StatusCode.OK.name)
        return web.json_response(body)

    async def _complete(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json(loads=json.loads)
        except ValueError:
            raise InvalidArgument("the request body is not JSON") from None
        info = self._loaded()
        name = body.get("model") if isinstance(body, dict) else None
        if name and name != info.model_name:
            raise NotFound(
                f"the model {name!r} does not exist; this server serves {info.model_name!r}"
            )
        request_in = generation_input(
            body, self._default_max_new_tokens, request.headers.get("X-Request-Id", "")
        )
        generation = await self._runtime.generate(request_in)
        self._metrics.latency(generation.latency_s)
        log.info(
            "chat request_id=%s code=OK images=%d completion_tokens=%d latency_ms=%.1f",
            request_in.request_id or "-",
            len(request_in.images),
            generation.output.completion_token_count,
            generation.latency_s * 1000,
        )
        return completion_body(generation, request_in.return_logprobs)


def build_app(
    runtime: ModelRuntime, metrics: ModelMetrics, default_max_new_tokens: int
) -> web.Application:
    """The aiohttp application with both routes."""
    handlers = OpenAIHandlers(runtime, metrics, default_max_new_tokens)
    app = web.Application(client_max_size=MAX_MESSAGE_BYTES)
    app.router.add_post("/v1/chat/completions", handlers.chat_completions)
    app.router.add_get("/v1/models", handlers.models)
    return app


async def start_openai_server(
    app: web.Application, host: str, port: int
) -> tuple[web.AppRunner, int]:
    """Serve ``app`` on ``host:port`` (0 lets the OS choose); the runner and the bound port."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_port=False)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise OSError(f"cannot listen on {host}:{port} (OpenAI endpoint)") from exc
    return runner, int(runner.addresses[0][1])
