"""Items per second of the ``hf`` backend on the tiny model at concurrency 16, with dynamic
batching (batch size 8) against batch size 1, in the same run, through real model servers.

Run with ``make bench`` (or ``pytest tests/bench/bench_hf_batching.py -s -m bench``).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from model_servers.testing import png_bytes, start_model_server, wait_until_serving
from rpc.client import aio_channel
from vigil.model.v1 import model_pb2, model_pb2_grpc

CONCURRENCY = 16
ITEMS = 96
ROUNDS = 3
PROMPT = (
    "Which plane is this slice?\nA. axial\nB. coronal\nC. sagittal\n"
    "Answer: <letter>\nConfidence: <0-100>"
)


async def items_per_second(address: str, requests: list[model_pb2.GenerateRequest]) -> float:
    """Items/s of an asyncio client with CONCURRENCY requests in flight."""
    async with aio_channel(address) as channel:
        stub = model_pb2_grpc.ModelServiceStub(channel)
        await stub.Generate(requests[0], timeout=60)  # warm up
        it = iter(requests)

        async def worker() -> None:
            for request in it:
                await stub.Generate(request, timeout=120)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        return len(requests) / (time.perf_counter() - started)


@pytest.mark.bench
def test_hf_batching_throughput(tiny_model_dir: Path, tmp_path: Path) -> None:
    requests = [
        model_pb2.GenerateRequest(
            images=[model_pb2.Image(data=png_bytes(32 + i % 7, 40), media_type="image/png")],
            prompt=PROMPT,
            request_id=f"r-{i}",
        )
        for i in range(ITEMS)
    ]
    common = ["--backend", "hf", "--model-path", str(tiny_model_dir), "--torch-threads", "1"]
    figures: dict[int, list[float]] = {1: [], 8: []}
    for batch_size in figures:
        server = start_model_server(
            tmp_path / f"b{batch_size}", *common, "--max-batch-size", str(batch_size)
        )
        try:
            wait_until_serving(server.address)
            for _ in range(ROUNDS):
                figures[batch_size].append(asyncio.run(items_per_second(server.address, requests)))
        finally:
            server.terminate()
    single, batched = max(figures[1]), max(figures[8])
    print(
        f"\nhf backend, tiny LLaVA, 1 torch thread, {ITEMS} items, concurrency {CONCURRENCY},"
        f" up to 32 new tokens, best of {ROUNDS}:\n"
        f"  batch size 1 : {single:7.1f} items/s  (runs: {', '.join(f'{x:.1f}' for x in figures[1])})\n"
        f"  batch size 8 : {batched:7.1f} items/s  (runs: {', '.join(f'{x:.1f}' for x in figures[8])})\n"
        f"  speed-up     : {batched / single:7.2f}x  (target >= 2x)"
    )
