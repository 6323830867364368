"""Items per second through the gateway against the ``random`` backend, next to a direct gRPC
loop against the same server with the same concurrency, in the same run.

Run with ``make bench`` (or ``pytest tests/bench/bench_gateway_throughput.py -s -m bench``).
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime

import pytest

from rpc.client import aio_channel
from tests.stack import Stack, gateway_stub, register, wait_run
from vigil.gateway.v1 import gateway_pb2 as gw
from vigil.model.v1 import model_pb2, model_pb2_grpc

CONCURRENCY = 8
ROUNDS = 3


async def direct_loop(address: str, requests: list[model_pb2.GenerateRequest]) -> float:
    """Items/s of a plain asyncio client with CONCURRENCY requests in flight."""
    async with aio_channel(address) as channel:
        stub = model_pb2_grpc.ModelServiceStub(channel)
        it = iter(requests)

        async def worker() -> None:
            for req in it:
                await stub.Generate(req, timeout=30)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        return len(requests) / (time.perf_counter() - t0)


def _seconds(ts) -> float:
    return datetime.timestamp(ts.ToDatetime())


@pytest.mark.bench
def test_gateway_throughput_vs_direct_loop(stack: Stack, small_benchmark) -> None:
    bench = small_benchmark
    items = bench.items(columns=["item_id", "image_path", "media_type", "prompt"])
    requests = [
        model_pb2.GenerateRequest(
            images=[model_pb2.Image(data=bench.read_image(r.image_path), media_type=r.media_type)],
            prompt=r.prompt,
            request_id=r.item_id,
        )
        for r in items.itertuples()
    ]
    model = stack.start_model("random", "random")
    gateway_proc = stack.start_gateway()
    gateway = gateway_stub(gateway_proc.address)
    register(gateway, "random", model.address, concurrency=CONCURRENCY)

    direct, through = [], []
    for _ in range(ROUNDS):
        direct.append(asyncio.run(direct_loop(model.address, requests)))
        run_id = gateway.StartRun(
            gw.StartRunRequest(endpoint_name="random", benchmark=bench.id), timeout=30
        ).run.run_id
        run = wait_run(gateway, run_id)
        assert run.state == gw.RUN_STATE_SUCCEEDED
        through.append(run.completed_count / (_seconds(run.end_time) - _seconds(run.start_time)))
    best_direct, best_gateway = max(direct), max(through)
    print(
        f"\nthroughput, random backend, {len(requests)} items, concurrency {CONCURRENCY},"
        f" best of {ROUNDS}:\n"
        f"  direct gRPC loop : {best_direct:8.1f} items/s  (runs: {', '.join(f'{x:.0f}' for x in direct)})\n"
        f"  through gateway  : {best_gateway:8.1f} items/s  (runs: {', '.join(f'{x:.0f}' for x in through)})\n"
        f"  gateway / direct : {best_gateway / best_direct:8.2f}"
    )
