"""The data plane: loading a backend and running checked requests on it, free of any transport.

The servicer converts protobuf to the domain types here and back; the same runtime could sit
behind HTTP. Loading runs in a daemon thread (a SIGTERM during a slow load still exits promptly);
generation runs in one worker thread behind a dynamic batcher (``model_servers.batching``), so
the event loop (health checks, DescribeModel) always answers. A backend with ``generate_batch``
gets batches of up to ``max_batch_size`` requests; any other backend gets one request at a time.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar

from model_servers.backends.base import (
    Backend,
    BatchBackend,
    GenerationInput,
    GenerationOutput,
    ModelInfo,
)
from model_servers.batching import Batcher, BatchingConfig
from model_servers.images import check_media_type, decode_image
from rpc.errors import InvalidArgument, Unavailable

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Generation:
    """A finished generation with the model that made it and the backend time it took."""

    output: GenerationOutput
    info: ModelInfo
    latency_s: float


def validate(request: GenerationInput, max_images: int) -> None:
    """Reject what no backend should see: an empty prompt, too many or undecodable images."""
    if not request.prompt.strip():
        raise InvalidArgument("prompt is empty")
    if request.max_new_tokens < 1:
        raise InvalidArgument(f"max_new_tokens must be positive, got {request.max_new_tokens}")
    if len(request.images) > max_images:
        raise InvalidArgument(
            f"request has {len(request.images)} images; this server takes at most {max_images}"
        )
    if request.media_types and len(request.media_types) != len(request.images):
        raise InvalidArgument("media_types and images differ in length")
    for index, media_type in enumerate(request.media_types):
        check_media_type(media_type, index)
    for index, data in enumerate(request.images):
        decode_image(data, index)


async def run_in_daemon_thread(fn: Callable[[], T], name: str) -> T:
    """Await ``fn()`` run in a daemon thread, which never holds up interpreter exit."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def target() -> None:
        try:
            result = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            error: BaseException | None = exc
            result = None
        else:
            error = None
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop closed while we worked: nobody is waiting
            pass

    threading.Thread(target=target, name=name, daemon=True).start()
    return await future


class ModelRuntime:
    """One backend, its readiness, the checks every request passes before it, and its batcher."""

    def __init__(
        self, backend: Backend, *, max_images: int = 8, batching: BatchingConfig | None = None
    ) -> None:
        self.backend = backend
        self.max_images = max_images
        self._ready = False
        config = batching or BatchingConfig()
        self._batch_backend = backend if isinstance(backend, BatchBackend) else None
        if self._batch_backend is None:  # one request at a time, no waiting for company
            config = replace(config, max_batch_size=1, max_queue_delay_s=0.0)
        self._batcher: Batcher[GenerationInput, Generation] = Batcher(
            self._run_batch, config, name=f"generate-{backend.name}"
        )

    @property
    def batching(self) -> BatchingConfig:
        """The batching this runtime applies (batch size 1 for a backend without batches)."""
        return self._batcher.config

    @property
    def ready(self) -> bool:
        """Whether the backend has loaded and takes requests."""
        return self._ready

    async def load(self) -> ModelInfo:
        """Load the backend off the event loop; raises what the backend's ``load`` raises."""
        started = time.perf_counter()
        await run_in_daemon_thread(self.backend.load, name=f"load-{self.backend.name}")
        info = self.backend.describe()
        self._ready = True
        log.info(
            "loaded backend=%s model=%s version=%s in %.1fs",
            info.backend,
            info.model_name,
            info.model_version,
            time.perf_counter() - started,
        )
        return info

    def describe(self) -> ModelInfo | None:
        """The served model, or None while it loads."""
        return self.backend.describe() if self._ready else None

    def loaded(self) -> ModelInfo:
        """The served model; UNAVAILABLE while it loads."""
        info = self.describe()
        if info is None:
            raise Unavailable("model is loading")
        return info

    async def generate(
        self, request: GenerationInput, *, timeout_s: float | None = None
    ) -> Generation:
        """Check and run one request through the batcher.

        ``timeout_s`` (the caller's remaining deadline) bounds the time it may wait in the queue:
        past it, the request is dropped with DEADLINE_EXCEEDED before it reaches the model. A
        full queue is RESOURCE_EXHAUSTED; a cancelled call is dropped from the queue.
        """
        if not self._ready:
            raise Unavailable("model is loading")
        return await self._batcher.submit(request, timeout_s)

    def _run_batch(self, requests: list[GenerationInput]) -> list[Generation | BaseException]:
        """Runs in the batcher's thread: check each request, then generate the good ones."""
        results: list[Generation | BaseException | None] = []
        good: list[GenerationInput] = []
        for request in requests:
            try:
                validate(request, self.max_images)
            except InvalidArgument as exc:
                results.append(exc)
            else:
                results.append(None)
                good.append(request)
        if good:
            started = time.perf_counter()
            outputs = self._generate(good)
            latency = time.perf_counter() - started
            info = self.backend.describe()
            produced = iter(outputs)
            results = [
                Generation(next(produced), info, latency) if r is None else r for r in results
            ]
        return [r for r in results if r is not None]

    def _generate(self, requests: list[GenerationInput]) -> list[GenerationOutput]:
        if self._batch_backend is not None and len(requests) > 1:
            outputs = self._batch_backend.generate_batch(requests)
            if len(outputs) != len(requests):
                raise RuntimeError(f"{len(outputs)} outputs for {len(requests)} requests")
            return outputs
        return [self.backend.generate(request) for request in requests]

    def close(self) -> None:
        """Fail queued work with UNAVAILABLE; a generation already running finishes."""
        self._ready = False
        self._batcher.close()
