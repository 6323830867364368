"""The model server in-process, with real backends whose load or generate waits on an event.

These pin down what a subprocess cannot show deterministically: NOT_SERVING and UNAVAILABLE for
the whole load, health answering while a generation runs, and a load failure stopping the server.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from model_servers.backends import (
    BackendLoadError,
    BackendSettings,
    GenerationInput,
    create_backend,
)
from model_servers.main import serve
from model_servers.settings import ModelServerSettings
from model_servers.testing import GatedBackend, png_bytes
from model_servers.tiny import ensure_tiny_llava
from rpc.client import aio_channel
from vigil.model.v1 import model_pb2, model_pb2_grpc

PROMPT = "Which plane?\nA. axial\nB. coronal\nC. sagittal"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def settings(tmp_path: Path) -> ModelServerSettings:
    return ModelServerSettings(port=0, metrics_port=0, ready_file=tmp_path / "ready.json")


async def wait_ready_file(path: Path, server: asyncio.Task[None]) -> dict[str, int]:
    for _ in range(500):
        if path.exists():
            return json.loads(path.read_text())
        if server.done():
            server.result()
        await asyncio.sleep(0.01)
    raise TimeoutError("no ready file")


async def health(channel: grpc.aio.Channel) -> int:
    reply = await health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service="vigil.model.v1.ModelService"), timeout=2
    )
    return reply.status


def test_not_serving_and_unavailable_until_loaded(tmp_path: Path) -> None:
    backend = GatedBackend()

    async def scenario() -> None:
        stop = asyncio.Event()
        server = asyncio.create_task(serve(settings(tmp_path), backend=backend, stop=stop))
        ports = await wait_ready_file(tmp_path / "ready.json", server)
        async with aio_channel(f"127.0.0.1:{ports['grpc_port']}") as channel:
            stub = model_pb2_grpc.ModelServiceStub(channel)
            request = model_pb2.GenerateRequest(prompt=PROMPT, request_id="r-1")
            for _ in range(3):  # stays so for as long as the load takes
                assert await health(channel) == NOT_SERVING
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.Generate(request, timeout=2)
                assert info.value.code() == grpc.StatusCode.UNAVAILABLE
                assert info.value.details() == "model is loading"
                described = await stub.DescribeModel(model_pb2.DescribeModelRequest(), timeout=2)
                assert (described.ready, described.backend) == (False, "gated")
                await asyncio.sleep(0.05)
            backend.release_load.set()
            for _ in range(200):
                if await health(channel) == SERVING:
                    break
                await asyncio.sleep(0.01)
            assert await health(channel) == SERVING
            reply = await stub.Generate(request, timeout=5)
            assert "Answer:" in reply.text and reply.model_name == "random-baseline"
            described = await stub.DescribeModel(model_pb2.DescribeModelRequest(), timeout=2)
            assert described.ready
        stop.set()
        await asyncio.wait_for(server, timeout=10)

    asyncio.run(scenario())


def test_health_answers_while_a_generation_runs(tmp_path: Path) -> None:
    backend = GatedBackend()
    backend.release_load.set()
    backend.hold_generate.clear()

    async def scenario() -> None:
        stop = asyncio.Event()
        server = asyncio.create_task(serve(settings(tmp_path), backend=backend, stop=stop))
        ports = await wait_ready_file(tmp_path / "ready.json", server)
        async with aio_channel(f"127.0.0.1:{ports['grpc_port']}") as channel:
            while await health(channel) != SERVING:
                await asyncio.sleep(0.01)
            stub = model_pb2_grpc.ModelServiceStub(channel)
            call = asyncio.ensure_future(
                stub.Generate(model_pb2.GenerateRequest(prompt=PROMPT), timeout=10)
            )
            assert await asyncio.to_thread(backend.generating.wait, 5)
            started = time.monotonic()
            assert await health(channel) == SERVING
            described = await stub.DescribeModel(model_pb2.DescribeModelRequest(), timeout=2)
            assert described.ready
            assert time.monotonic() - started < 1.0
            assert not call.done()
            backend.hold_generate.set()
            assert (await call).text
        stop.set()
        await asyncio.wait_for(server, timeout=10)

    asyncio.run(scenario())


def test_load_failure_raises_and_stops_the_server(tmp_path: Path) -> None:
    backend = GatedBackend(fail_load="cannot load model from /nowhere: broken")
    backend.release_load.set()

    async def scenario() -> int:
        server = asyncio.create_task(
            serve(settings(tmp_path), backend=backend, stop=asyncio.Event())
        )
        with pytest.raises(BackendLoadError, match="/nowhere"):
            await asyncio.wait_for(server, timeout=10)
        return json.loads((tmp_path / "ready.json").read_text())["grpc_port"]

    port = asyncio.run(scenario())

    async def probe() -> None:
        async with aio_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await health(channel)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE

    asyncio.run(probe())


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir: Path) -> Path:
    """The session's tiny LLaVA model (built once, in tests/conftest.py)."""
    return tiny_model_dir


def test_tiny_llava_is_deterministic_and_fast(tiny_model: Path, tmp_path: Path) -> None:
    from model_servers.backends.hf import model_version

    again = ensure_tiny_llava(tmp_path / "again")
    assert model_version(again) == model_version(tiny_model)
    assert ensure_tiny_llava(tiny_model) == tiny_model  # already there: not rebuilt
    backend = create_backend("hf", BackendSettings(model_path=tiny_model, torch_threads=1))
    backend.load()
    request = GenerationInput(
        images=[png_bytes(), png_bytes(20, 70, (0, 200, 0))],
        media_types=["image/png", "image/png"],
        prompt=PROMPT,
        max_new_tokens=32,
        return_logprobs=True,
    )
    first = backend.generate(request)
    started = time.perf_counter()
    runs = 5
    for _ in range(runs):
        assert backend.generate(request) == first
    per_item = (time.perf_counter() - started) / runs
    assert per_item < 1.0, f"{per_item:.3f}s per item"
    # Two images of 16 tokens each, plus the text.
    assert first.prompt_token_count > 32
    assert len(first.logprobs) == first.completion_token_count
    print(f"tiny-llava: {per_item * 1000:.0f} ms per item (32 new tokens, 2 images)")
