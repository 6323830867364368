"""Dynamic batching in the model server: the hf backend's padded batches give the same text as
one request at a time, and the queue's limits reach gRPC clients with the right status codes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import pytest

from model_servers.backends import BackendSettings, GenerationInput, create_backend
from model_servers.backends.base import GenerationOutput
from model_servers.main import serve
from model_servers.settings import ModelServerSettings
from model_servers.testing import GatedBackend, png_bytes
from rpc.client import aio_channel
from vigil.model.v1 import model_pb2, model_pb2_grpc

PROMPT = (
    "Which plane is this slice?\nA. axial\nB. coronal\nC. sagittal\n"
    "Answer: <letter>\nConfidence: <0-100>"
)


def mixed_requests() -> list[GenerationInput]:
    """Requests of different prompt lengths, image counts, token limits and log-prob wishes."""
    requests = []
    for i in range(10):
        images = [png_bytes(30 + 3 * i, 40, (20 * i, 100, 255 - 20 * i))] * (i % 3)
        requests.append(
            GenerationInput(
                images=images,
                media_types=["image/png"] * len(images),
                prompt=PROMPT[: 25 + 9 * i],
                max_new_tokens=4 + 3 * i,
                return_logprobs=i % 2 == 0,
                request_id=f"r-{i}",
            )
        )
    return requests


def test_batched_generation_equals_one_at_a_time(tiny_model_dir: Path) -> None:
    backend = create_backend("hf", BackendSettings(model_path=tiny_model_dir, torch_threads=1))
    backend.load()
    requests = mixed_requests()
    alone = [backend.generate(request) for request in requests]
    together = backend.generate_batch(requests)  # type: ignore[attr-defined]
    assert len(together) == len(requests)
    for request, one, batched in zip(requests, alone, together, strict=True):
        assert batched.text == one.text
        assert batched.prompt_token_count == one.prompt_token_count
        assert (
            batched.completion_token_count == one.completion_token_count <= (request.max_new_tokens)
        )
        assert batched.finish_reason == one.finish_reason
        assert [t for t, _ in batched.logprobs] == [t for t, _ in one.logprobs]
        assert len(batched.logprobs) == (
            one.completion_token_count if request.return_logprobs else 0
        )
        for (_, a), (_, b) in zip(batched.logprobs, one.logprobs, strict=True):
            assert a == pytest.approx(b, abs=1e-4)


def server_settings(tmp_path: Path, **fields: object) -> ModelServerSettings:
    return ModelServerSettings(port=0, metrics_port=0, ready_file=tmp_path / "ready.json", **fields)  # type: ignore[arg-type]


async def ready_port(path: Path, server: asyncio.Task[None]) -> int:
    for _ in range(3000):
        if path.exists():
            return int(json.loads(path.read_text())["grpc_port"])
        if server.done():
            server.result()
        await asyncio.sleep(0.01)
    raise TimeoutError("no ready file")


async def wait_ready(stub: model_pb2_grpc.ModelServiceStub) -> None:
    for _ in range(3000):
        if (await stub.DescribeModel(model_pb2.DescribeModelRequest(), timeout=2)).ready:
            return
        await asyncio.sleep(0.01)
    raise TimeoutError("model never loaded")


def request_pb(i: int) -> model_pb2.GenerateRequest:
    return model_pb2.GenerateRequest(
        images=[model_pb2.Image(data=png_bytes(30 + i, 40), media_type="image/png")],
        prompt=PROMPT,
        request_id=f"r-{i}",
    )


def test_concurrent_requests_through_the_server_are_batched(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    backend = create_backend("hf", BackendSettings(model_path=tiny_model_dir, torch_threads=1))
    sizes: list[int] = []
    original = backend.generate_batch  # type: ignore[attr-defined]

    def recording(requests: list[GenerationInput]) -> list[GenerationOutput]:
        sizes.append(len(requests))
        return original(requests)

    backend.generate_batch = recording  # type: ignore[attr-defined]
    settings = server_settings(tmp_path, max_batch_size=8, max_queue_delay_ms=50)

    async def scenario() -> tuple[list[str], list[str]]:
        stop = asyncio.Event()
        server = asyncio.create_task(serve(settings, backend=backend, stop=stop))
        port = await ready_port(tmp_path / "ready.json", server)
        async with aio_channel(f"127.0.0.1:{port}") as channel:
            stub = model_pb2_grpc.ModelServiceStub(channel)
            await wait_ready(stub)
            together = await asyncio.gather(
                *(stub.Generate(request_pb(i), timeout=60) for i in range(16))
            )
            alone = [(await stub.Generate(request_pb(i), timeout=60)) for i in range(16)]
        stop.set()
        await asyncio.wait_for(server, timeout=10)
        return [r.text for r in together], [r.text for r in alone]

    together, alone = asyncio.run(scenario())
    assert together == alone
    assert max(sizes) > 1 and max(sizes) <= 8


def test_full_queue_and_queued_deadline_reach_the_client(tmp_path: Path) -> None:
    backend = GatedBackend()  # the random baseline without batches: one request at a time
    backend.release_load.set()
    backend.hold_generate.clear()
    seen: list[str] = []
    original = backend.generate

    def recording(request: GenerationInput) -> GenerationOutput:
        seen.append(request.request_id)
        return original(request)

    backend.generate = recording  # type: ignore[method-assign]
    settings = server_settings(tmp_path, max_queue_size=1)

    async def scenario() -> None:
        stop = asyncio.Event()
        server = asyncio.create_task(serve(settings, backend=backend, stop=stop))
        port = await ready_port(tmp_path / "ready.json", server)
        async with aio_channel(f"127.0.0.1:{port}") as channel:
            stub = model_pb2_grpc.ModelServiceStub(channel)
            await wait_ready(stub)
            running = asyncio.ensure_future(stub.Generate(request_pb(0), timeout=30))
            assert await asyncio.to_thread(backend.generating.wait, 5)
            # The worker holds request 0; request 1 waits in the queue, which is then full.
            with pytest.raises(grpc.aio.AioRpcError) as late:
                await stub.Generate(request_pb(1), timeout=0.3)
            assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            queued = asyncio.ensure_future(stub.Generate(request_pb(2), timeout=30))
            await asyncio.sleep(0.2)
            with pytest.raises(grpc.aio.AioRpcError) as full:
                await stub.Generate(request_pb(3), timeout=30)
            assert full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "queue is full" in full.value.details()
            backend.hold_generate.set()
            assert (await running).text and (await queued).text
        stop.set()
        await asyncio.wait_for(server, timeout=10)

    asyncio.run(scenario())
    assert seen == ["r-0", "r-2"]  # the request whose deadline passed never reached the model
