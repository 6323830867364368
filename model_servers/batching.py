"""Dynamic batching, free of any transport: a bounded queue in front of one worker thread.

Callers ``await submit(item)``; the worker takes the oldest waiting item, then keeps collecting
until it holds ``max_batch_size`` items or ``max_queue_delay_s`` has passed since it took the
first, and hands the batch to ``run_batch`` in its own thread (the event loop keeps answering
health checks meanwhile). ``run_batch`` returns one result per item, in order; a result that is
an exception fails only that item, and an exception raised by ``run_batch`` fails the whole batch.

- A full queue refuses new work at once with ``ResourceExhausted`` (the caller may retry).
- An item whose deadline passed while it waited is dropped with ``DeadlineExceeded``; an item
  whose caller stopped waiting (a cancelled RPC) is dropped silently. Neither reaches the model.
- ``close`` fails everything still queued with ``Unavailable``; a batch already running finishes.

Generic over the item and result types, so the data plane uses it for ``GenerationInput`` and
tests drive it with plain values.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Generic, TypeVar

from rpc.errors import DeadlineExceeded, ResourceExhausted, Unavailable

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class BatchingConfig:
    """How a batcher groups work."""

    max_batch_size: int = 8
    """The most items one call of ``run_batch`` gets."""

    max_queue_delay_s: float = 0.010
    """How long the worker waits for more items after taking the first of a batch."""

    max_queue_size: int = 256
    """The most items waiting (not counting the batch being run); more is ResourceExhausted."""

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {self.max_batch_size}")
        if self.max_queue_delay_s < 0:
            raise ValueError(f"max_queue_delay_s must be >= 0, got {self.max_queue_delay_s}")
        if self.max_queue_size < 1:
            raise ValueError(f"max_queue_size must be at least 1, got {self.max_queue_size}")


@dataclass
class _Pending(Generic[T, R]):
    item: T
    future: Future[R]
    deadline: float | None  # time.monotonic() value, or None for no deadline


class Batcher(Generic[T, R]):
    """Groups submitted items into batches for ``run_batch``, run by one daemon thread."""

    def __init__(
        self,
        run_batch: Callable[[list[T]], Sequence[R | BaseException]],
        config: BatchingConfig | None = None,
        *,
        name: str = "batcher",
        on_batch: Callable[[int], None] | None = None,
    ) -> None:
        self.config = config or BatchingConfig()
        self._run_batch = run_batch
        self._on_batch = on_batch
        self._queue: deque[_Pending[T, R]] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @property
    def queued(self) -> int:
        """Items waiting, not counting a batch being run."""
        with self._cond:
            return len(self._queue)

    def submit_nowait(self, item: T, timeout_s: float | None = None) -> Future[R]:
        """Queue ``item``; a future of its result. Raises ResourceExhausted when the queue is full
        and Unavailable after ``close``. ``timeout_s`` is how long it may wait in the queue."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        future: Future[R] = Future()
        with self._cond:
            if self._closed:
                raise Unavailable("server is stopping")
            if len(self._queue) >= self.config.max_queue_size:
                self._purge_locked()
            if len(self._queue) >= self.config.max_queue_size:
                raise ResourceExhausted(
                    f"request queue is full ({self.config.max_queue_size} waiting); retry later"
                )
            self._queue.append(_Pending(item, future, deadline))
            self._cond.notify()
        return future

    async def submit(self, item: T, timeout_s: float | None = None) -> R:
        """Queue ``item`` and await its result. Cancelling the await drops the item if it has
        not started yet."""
        future = self.submit_nowait(item, timeout_s)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if future.cancel():  # still queued: give its place back
                with self._cond:
                    self._purge_locked()
            raise

    def _purge_locked(self) -> None:
        """Drop queued items nobody waits for any more, and fail those past their deadline."""
        now = time.monotonic()
        kept: deque[_Pending[T, R]] = deque()
        for pending in self._queue:
            if pending.future.cancelled():
                continue
            if pending.deadline is not None and now >= pending.deadline:
                _settle(pending.future, error=_queued_too_long())
                continue
            kept.append(pending)
        self._queue = kept

    def close(self) -> None:
        """Refuse new work and fail what is queued with Unavailable; returns at once."""
        with self._cond:
            self._closed = True
            dropped = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        for pending in dropped:
            _settle(pending.future, error=Unavailable("server is stopping"))

    def _take_batch(self) -> list[_Pending[T, R]] | None:
        """Block for the next batch; None once closed."""
        config = self.config
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            batch = [self._queue.popleft()]
            flush_at = time.monotonic() + config.max_queue_delay_s
            while len(batch) < config.max_batch_size:
                if self._queue:
                    batch.append(self._queue.popleft())
                    continue
                remaining = flush_at - time.monotonic()
                if remaining <= 0 or self._closed:
                    break
                self._cond.wait(remaining)
            return batch

    def _loop(self) -> None:
        while True:
            batch = self._take_batch()
            if batch is None:
                return
            now = time.monotonic()
            live: list[_Pending[T, R]] = []
            for pending in batch:
                if not pending.future.set_running_or_notify_cancel():
                    continue  # the caller stopped waiting
                if pending.deadline is not None and now >= pending.deadline:
                    pending.future.set_exception(_queued_too_long())
                    continue
                live.append(pending)
            if not live:
                continue
            if self._on_batch is not None:
                self._on_batch(len(live))
            try:
                results = list(self._run_batch([p.item for p in live]))
                if len(results) != len(live):
                    raise RuntimeError(
                        f"run_batch returned {len(results)} results for {len(live)} items"
                    )
            except BaseException as exc:  # noqa: BLE001 - handed to every waiting caller
                for pending in live:
                    _settle(pending.future, error=exc)
                continue
            for pending, result in zip(live, results, strict=True):
                if isinstance(result, BaseException):
                    _settle(pending.future, error=result)
                else:
                    _settle(pending.future, result=result)


def _queued_too_long() -> DeadlineExceeded:
    return DeadlineExceeded("deadline passed while the request was queued")


def _settle(future: Future[R], result: R | None = None, error: BaseException | None = None) -> None:
    if future.done():
        return
    if future.running() or future.set_running_or_notify_cancel():
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]
