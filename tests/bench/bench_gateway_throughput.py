"""Items per second through the gateway against the zero-latency ``random`` backend, through each
protocol adapter (Vigil gRPC, KServe v2 / Triton, OpenAI HTTP), next to a direct client loop for
that protocol against the same server with the same concurrency, in the same run.

The benchmark is the small brain-MRI suite with every image replaced by a 64 KB PNG (noise, so it
does not compress), as a real slice would weigh. Target: the gateway at least 60% of the direct
loop and at least 1,000 items/s.

Run with ``make bench`` (or ``pytest tests/bench/bench_gateway_throughput.py -s -m bench``).
"""

from __future__ import annotations

import asyncio
import base64
import io
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from benchmark import format as fmt
from benchmark.store import Benchmark, list_benchmarks, write_benchmark
from gateway.adapters.kserve import SAMPLING_PARAMETERS, bool_input, bytes_input
from gateway.adapters.openai import chat_body
from rpc.client import CHANNEL_OPTIONS, aio_channel
from tests.stack import Stack, gateway_stub, wait_run
from vigil.gateway.v1 import gateway_pb2 as gw
from vigil.model.v1 import model_pb2, model_pb2_grpc

CONCURRENCY = 8
ROUNDS = 3
IMAGE_BYTES = 64 * 1024
MODEL = "random-baseline"
PROTOCOLS = {
    "vigil": gw.PROTOCOL_VIGIL,
    "kserve_v2": gw.PROTOCOL_KSERVE_V2,
    "openai": gw.PROTOCOL_OPENAI,
}

Item = tuple[str, bytes, str]  # prompt, image, media type


def noise_png(seed: int, size: int = IMAGE_BYTES) -> bytes:
    """An RGB noise PNG of about ``size`` bytes (noise does not compress)."""
    from PIL import Image

    side = int((size / 3) ** 0.5)
    pixels = np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


def heavy_benchmark(root: Path) -> Benchmark:
    """The small brain-MRI suite with 64 KB images (built once per benchmark root)."""
    from benchmark.suites import build_suite

    for bench in list_benchmarks(root):
        if bench.meta.suite == "brain-mri" and bench.meta.size == "small-64k":
            return bench
    manifest, images = build_suite("brain-mri", "small", 0, progress=False)
    heavy: dict[str, bytes] = {}
    renamed: dict[str, str] = {}
    for index, path in enumerate(sorted(images)):
        data = noise_png(index)
        renamed[path] = fmt.image_path_for(data)
        heavy[renamed[path]] = data
    manifest = manifest.copy()
    manifest["image_path"] = [renamed.get(p, p) for p in manifest["image_path"]]
    return write_benchmark(
        root, "brain-mri-small-64k", "brain-mri", "small-64k", 0, manifest, heavy
    )


async def loop_over(items: list[Item], send: Callable[[Item], Awaitable[object]]) -> float:
    """Items/s of CONCURRENCY workers sending every item once."""
    it = iter(items)

    async def worker() -> None:
        for item in it:
            await send(item)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return len(items) / (time.perf_counter() - t0)


async def direct_vigil(address: str, items: list[Item]) -> float:
    async with aio_channel(address) as channel:
        stub = model_pb2_grpc.ModelServiceStub(channel)

        async def send(item: Item) -> object:
            prompt, image, media = item
            request = model_pb2.GenerateRequest(
                images=[model_pb2.Image(data=image, media_type=media)], prompt=prompt
            )
            return await stub.Generate(request, timeout=30)

        return await loop_over(items, send)


async def direct_kserve(address: str, items: list[Item]) -> float:
    from tritonclient.grpc.aio import InferenceServerClient

    async with InferenceServerClient(address, channel_args=CHANNEL_OPTIONS) as client:

        async def send(item: Item) -> object:
            prompt, image, _ = item
            inputs = [
                bytes_input("text_input", [prompt.encode()]),
                bytes_input("image", [base64.b64encode(image)]),
                bytes_input("sampling_parameters", [SAMPLING_PARAMETERS]),
                bool_input("exclude_input_in_output", True),
            ]
            return await client.infer(MODEL, inputs, client_timeout=30)

        return await loop_over(items, send)


async def direct_openai(address: str, items: list[Item]) -> float:
    url = f"http://{address}/v1/chat/completions"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def send(item: Item) -> object:
            prompt, image, media = item
            body = chat_body(MODEL, [(image, media)], prompt)
            headers = {"Content-Type": "application/json"}
            async with session.post(url, data=body, headers=headers, timeout=30) as response:
                assert response.status == 200
                return await response.read()

        return await loop_over(items, send)


DIRECT = {"vigil": direct_vigil, "kserve_v2": direct_kserve, "openai": direct_openai}


def _seconds(ts) -> float:
    return datetime.timestamp(ts.ToDatetime())


@pytest.mark.bench
def test_gateway_throughput_vs_direct_loop(stack: Stack, benchmark_root: Path) -> None:
    bench = heavy_benchmark(benchmark_root)
    rows = bench.items(columns=["item_id", "image_path", "media_type", "prompt"])
    items = [
        (r.prompt, bench.read_image(r.image_path), r.media_type or "image/png")
        for r in rows.itertuples()
        if r.image_path
    ]
    mean_kb = sum(len(image) for _, image, _ in items) / len(items) / 1024
    model = stack.start_model("random", "random", ["--openai-port", "0"])
    gateway = gateway_stub(stack.start_gateway().address)
    addresses = {
        "vigil": model.address,
        "kserve_v2": model.address,
        "openai": f"127.0.0.1:{model.ports['openai_port']}",
    }
    for name, protocol in PROTOCOLS.items():
        gateway.RegisterEndpoint(
            gw.RegisterEndpointRequest(
                endpoint=gw.Endpoint(
                    name=name, address=addresses[name], protocol=protocol,
                    max_concurrency=CONCURRENCY, model_name=MODEL,
                )
            ),
            timeout=10,
        )  # fmt: skip

    lines = []
    for name in PROTOCOLS:
        direct, through = [], []
        for _ in range(ROUNDS):
            direct.append(asyncio.run(DIRECT[name](addresses[name], items)))
            run_id = gateway.StartRun(
                gw.StartRunRequest(endpoint_name=name, benchmark=bench.id), timeout=30
            ).run.run_id
            run = wait_run(gateway, run_id)
            assert run.state == gw.RUN_STATE_SUCCEEDED, run.error_message
            assert run.error_count == 0
            elapsed = _seconds(run.end_time) - _seconds(run.start_time)
            through.append(run.completed_count / elapsed)
        best_direct, best_gateway = max(direct), max(through)
        lines.append(
            f"  {name:<10} direct {best_direct:7.0f}/s  gateway {best_gateway:7.0f}/s"
            f"  ratio {best_gateway / best_direct:5.2f}"
            f"  (direct runs: {', '.join(f'{x:.0f}' for x in direct)};"
            f" gateway runs: {', '.join(f'{x:.0f}' for x in through)})"
        )
    print(
        f"\nthroughput, random backend (zero latency), {len(items)} items per direct loop,"
        f" {run.completed_count} per run, images {mean_kb:.0f} KB, concurrency {CONCURRENCY},"
        f" best of {ROUNDS}:\n" + "\n".join(lines)
    )
