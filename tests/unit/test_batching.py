"""The dynamic batcher on plain values: grouping, per-item failures, a full queue, deadlines,
cancellation and close. No model, no transport."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from model_servers.batching import Batcher, BatchingConfig
from rpc.errors import DeadlineExceeded, InvalidArgument, ResourceExhausted, Unavailable


class Recorder:
    """A ``run_batch`` that doubles numbers, records batch sizes, and can be held shut."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def __call__(self, items: list[int]) -> list[int | BaseException]:
        self.entered.set()
        assert self.gate.wait(10)
        self.batches.append(list(items))
        return [InvalidArgument(f"bad {x}") if x < 0 else 2 * x for x in items]


def test_concurrent_items_share_batches_up_to_the_limit() -> None:
    run = Recorder()
    batcher = Batcher(run, BatchingConfig(max_batch_size=4, max_queue_delay_s=0.05))

    async def scenario() -> list[int]:
        return await asyncio.gather(*(batcher.submit(i) for i in range(10)))

    try:
        assert asyncio.run(scenario()) == [2 * i for i in range(10)]
    finally:
        batcher.close()
    assert max(len(b) for b in run.batches) == 4
    assert len(run.batches) <= 4  # 10 items in batches of at most 4, not 10 singles
    assert sorted(x for b in run.batches for x in b) == list(range(10))


def test_a_lone_item_waits_at_most_the_queue_delay() -> None:
    run = Recorder()
    batcher = Batcher(run, BatchingConfig(max_batch_size=8, max_queue_delay_s=0.02))
    try:
        started = time.monotonic()
        assert batcher.submit_nowait(21).result(timeout=5) == 42
        assert time.monotonic() - started < 1.0
    finally:
        batcher.close()
    assert run.batches == [[21]]


def test_an_item_error_fails_only_that_item() -> None:
    run = Recorder()
    batcher = Batcher(run, BatchingConfig(max_batch_size=4, max_queue_delay_s=0.05))

    async def scenario() -> list[object]:
        return await asyncio.gather(
            *(batcher.submit(x) for x in (1, -1, 3)), return_exceptions=True
        )

    try:
        first, bad, third = asyncio.run(scenario())
    finally:
        batcher.close()
    assert (first, third) == (2, 6)
    assert isinstance(bad, InvalidArgument) and bad.message == "bad -1"


def test_a_failing_batch_fails_every_item_and_the_worker_goes_on() -> None:
    calls: list[list[int]] = []

    def run(items: list[int]) -> list[int]:
        calls.append(items)
        if len(calls) == 1:
            raise RuntimeError("model broke")
        return items

    batcher = Batcher(run, BatchingConfig(max_batch_size=2, max_queue_delay_s=0.05))
    try:
        futures = [batcher.submit_nowait(i) for i in (1, 2)]
        for future in futures:
            with pytest.raises(RuntimeError, match="model broke"):
                future.result(timeout=5)
        assert batcher.submit_nowait(7).result(timeout=5) == 7
    finally:
        batcher.close()


def test_a_full_queue_is_resource_exhausted() -> None:
    run = Recorder()
    run.gate.clear()
    batcher = Batcher(run, BatchingConfig(max_batch_size=1, max_queue_delay_s=0, max_queue_size=2))
    try:
        running = batcher.submit_nowait(0)
        assert run.entered.wait(5)  # the worker holds item 0; the queue is empty again
        queued = [batcher.submit_nowait(1), batcher.submit_nowait(2)]
        with pytest.raises(ResourceExhausted, match="queue is full"):
            batcher.submit_nowait(3)
        run.gate.set()
        assert [f.result(timeout=5) for f in [running, *queued]] == [0, 2, 4]
        assert batcher.submit_nowait(3).result(timeout=5) == 6  # room again
    finally:
        run.gate.set()
        batcher.close()


def test_an_item_whose_deadline_passed_in_the_queue_is_dropped() -> None:
    run = Recorder()
    run.gate.clear()
    batcher = Batcher(run, BatchingConfig(max_batch_size=1, max_queue_delay_s=0))
    try:
        blocking = batcher.submit_nowait(0)
        assert run.entered.wait(5)
        late = batcher.submit_nowait(1, timeout_s=0.01)
        on_time = batcher.submit_nowait(2, timeout_s=30)
        time.sleep(0.05)
        run.gate.set()
        with pytest.raises(DeadlineExceeded, match="while the request was queued"):
            late.result(timeout=5)
        assert (blocking.result(timeout=5), on_time.result(timeout=5)) == (0, 4)
    finally:
        run.gate.set()
        batcher.close()
    assert [x for b in run.batches for x in b] == [0, 2]  # item 1 never reached the model


def test_a_cancelled_wait_drops_the_queued_item() -> None:
    run = Recorder()
    run.gate.clear()
    batcher = Batcher(run, BatchingConfig(max_batch_size=1, max_queue_delay_s=0))

    async def scenario() -> None:
        blocking = asyncio.ensure_future(batcher.submit(0))
        assert await asyncio.to_thread(run.entered.wait, 5)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(batcher.submit(1), timeout=0.05)
        run.gate.set()
        assert await blocking == 0
        assert await batcher.submit(5) == 10

    try:
        asyncio.run(scenario())
    finally:
        run.gate.set()
        batcher.close()
    assert [x for b in run.batches for x in b] == [0, 5]


def test_close_fails_queued_items_and_refuses_new_ones() -> None:
    run = Recorder()
    run.gate.clear()
    batcher = Batcher(run, BatchingConfig(max_batch_size=1, max_queue_delay_s=0))
    running = batcher.submit_nowait(0)
    assert run.entered.wait(5)
    queued = batcher.submit_nowait(1)
    batcher.close()
    with pytest.raises(Unavailable, match="stopping"):
        queued.result(timeout=5)
    with pytest.raises(Unavailable, match="stopping"):
        batcher.submit_nowait(2)
    run.gate.set()
    assert running.result(timeout=5) == 0  # the batch already running finishes


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"max_queue_delay_s": -1.0}, "max_queue_delay_s"),
        ({"max_queue_size": 0}, "max_queue_size"),
    ],
)
def test_config_rejects_nonsense(fields: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BatchingConfig(**fields)  # type: ignore[arg-type]
