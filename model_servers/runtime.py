"""The data plane: loading a backend and running checked requests on it, free of any transport.

The servicer converts protobuf to the domain types here and back; the same runtime could sit
behind HTTP. Loading runs in a daemon thread (a SIGTERM during a slow load still exits promptly);
generation runs in one worker thread, so calls are serialised and the event loop (health checks,
DescribeModel) always answers. Batching will replace the single worker.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from model_servers.backends.base import Backend, GenerationInput, GenerationOutput, ModelInfo
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
    """One backend, its readiness, and the checks every request passes before it."""

    def __init__(self, backend: Backend, *, max_images: int = 8) -> None:
        self.backend = backend
        self.max_images = max_images
        self._ready = False
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="generate")

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

    async def generate(self, request: GenerationInput) -> Generation:
        """Check and run one request in the generation worker."""
        if not self._ready:
            raise Unavailable("model is loading")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._generate_blocking, request)

    def _generate_blocking(self, request: GenerationInput) -> Generation:
        validate(request, self.max_images)
        started = time.perf_counter()
        output = self.backend.generate(request)
        latency = time.perf_counter() - started
        return Generation(output, self.backend.describe(), latency)

    def close(self) -> None:
        """Drop queued work; a generation already running finishes in its thread."""
        self._ready = False
        self._executor.shutdown(wait=False, cancel_futures=True)
