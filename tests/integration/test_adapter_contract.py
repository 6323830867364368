"""One contract suite for every gateway protocol adapter, each against a real server.

The peer is the Vigil model server (random backend) for all three: its ModelService for ``vigil``,
its KServe v2 / Triton service on the same port for ``kserve_v2``, and its OpenAI-compatible HTTP
endpoint for ``openai``. The random backend is deterministic in prompt and image, so every
protocol must return the same text for the same item. Then a run through the gateway for each
protocol records every item once.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from gateway.adapters import ADAPTERS, AdapterError, AdapterTarget, ModelAdapter, create_adapter
from model_servers.testing import png_bytes
from tests.stack import Proc, Stack, gateway_stub, wait_run
from vigil.gateway.v1 import gateway_pb2 as gw

T = TypeVar("T")

PROTOCOLS = ["vigil", "kserve_v2", "openai"]
PB_PROTOCOL = {
    "vigil": gw.PROTOCOL_VIGIL,
    "kserve_v2": gw.PROTOCOL_KSERVE_V2,
    "openai": gw.PROTOCOL_OPENAI,
}
MODEL = "random-baseline"
PROMPT = "Which plane is this slice?\nA. axial\nB. coronal\nC. sagittal\nAnswer with the letter."
IMAGE = (png_bytes(), "image/png")


@pytest.fixture(scope="module")
def servers(
    tmp_path_factory: pytest.TempPathFactory, benchmark_root: Path
) -> Iterator[dict[str, Proc]]:
    """A zero-latency and a slow random model server, each with its OpenAI endpoint on."""
    stack = Stack(tmp_path_factory.mktemp("contract"), benchmark_root)
    try:
        fast = stack.start_model("fast", "random", ["--openai-port", "0"])
        slow = stack.start_model("slow", "random", ["--openai-port", "0", "--latency-ms", "1000"])
        yield {"fast": fast, "slow": slow}
    finally:
        stack.close()


def address(proc: Proc, protocol: str) -> str:
    port = proc.ports["openai_port"] if protocol == "openai" else proc.ports["grpc_port"]
    return f"127.0.0.1:{port}"


def call(
    protocol: str,
    addr: str,
    use: Callable[[ModelAdapter], Awaitable[T]],
    model_name: str = "",
    model_version: str = "",
) -> T:
    """Run ``use`` against a fresh adapter in a fresh event loop, and close the adapter."""

    async def scenario() -> T:
        adapter = create_adapter(protocol, AdapterTarget(addr, model_name, model_version))
        try:
            return await use(adapter)
        finally:
            await adapter.close()

    return asyncio.run(scenario())


def test_every_protocol_is_registered() -> None:
    assert set(PROTOCOLS) <= set(ADAPTERS)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_describe(servers: dict[str, Proc], protocol: str) -> None:
    identity = call(protocol, address(servers["fast"], protocol), lambda a: a.describe(5))
    assert identity.ready
    assert (identity.model_name, identity.model_version) == (MODEL, "1")
    if protocol != "vigil":  # Vigil's ModelService has no model config to digest
        assert len(identity.config_digest) == 16


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_generate_same_text_and_provenance_on_every_protocol(
    servers: dict[str, Proc], protocol: str
) -> None:
    fast = servers["fast"]
    reference = call("vigil", address(fast, "vigil"), lambda a: a.generate([IMAGE], PROMPT, "r", 5))

    async def use(adapter: ModelAdapter) -> tuple[object, ...]:
        identity = await adapter.describe(5)
        first = await adapter.generate([IMAGE], PROMPT, "req-1", 5)
        again = await adapter.generate([IMAGE], PROMPT, "req-2", 5)
        text_only = await adapter.generate([], PROMPT, "req-3", 5)
        return identity, first, again, text_only

    identity, first, again, text_only = call(protocol, address(fast, protocol), use)
    assert "Answer:" in reference.text
    assert first.text == again.text == reference.text  # type: ignore[attr-defined]
    assert (first.model_name, first.model_version) == (MODEL, "1")  # type: ignore[attr-defined]
    assert first.config_digest == identity.config_digest  # type: ignore[attr-defined]
    # Without the image the seeded draw differs from the reference, but the answer still comes.
    assert "Answer:" in text_only.text  # type: ignore[attr-defined]
    reference_text_only = call(
        "vigil", address(fast, "vigil"), lambda a: a.generate([], PROMPT, "r", 5)
    )
    assert text_only.text == reference_text_only.text  # type: ignore[attr-defined]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_generate_without_describe_first(servers: dict[str, Proc], protocol: str) -> None:
    for model_name in ("", MODEL):
        reply = call(
            protocol,
            address(servers["fast"], protocol),
            lambda a: a.generate([IMAGE], PROMPT, "r", 5),
            model_name=model_name,
        )
        assert reply.model_name == MODEL and reply.text
        if protocol != "vigil":
            assert len(reply.config_digest) == 16


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_deadline_is_a_timeout(servers: dict[str, Proc], protocol: str) -> None:
    with pytest.raises(AdapterError) as info:
        call(
            protocol,
            address(servers["slow"], protocol),
            lambda a: a.generate([IMAGE], PROMPT, "late", 0.2),
            model_name=MODEL,
        )
    assert info.value.timeout and not info.value.retryable


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bad_image_is_not_retryable(servers: dict[str, Proc], protocol: str) -> None:
    with pytest.raises(AdapterError) as info:
        call(
            protocol,
            address(servers["fast"], protocol),
            lambda a: a.generate([(b"\x89PNG not really", "image/png")], PROMPT, "bad", 5),
        )
    assert not info.value.retryable and not info.value.timeout
    assert "does not decode" in info.value.message
    # The server keeps serving.
    reply = call(
        protocol, address(servers["fast"], protocol), lambda a: a.generate([IMAGE], PROMPT, "ok", 5)
    )
    assert reply.text


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_server_down_is_a_retryable_transport_error(protocol: str) -> None:
    # A port the OS assigned to a socket that never listens: connections are refused.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        addr = f"127.0.0.1:{closed.getsockname()[1]}"
        for use in (lambda a: a.describe(2), lambda a: a.generate([IMAGE], PROMPT, "down", 2)):
            with pytest.raises(AdapterError) as info:
                call(protocol, addr, use, model_name=MODEL)
            assert info.value.retryable and not info.value.timeout


@pytest.mark.parametrize("protocol", ["kserve_v2", "openai"])
def test_unknown_model_is_refused(servers: dict[str, Proc], protocol: str) -> None:
    addr = address(servers["fast"], protocol)
    for use in (lambda a: a.describe(5), lambda a: a.generate([IMAGE], PROMPT, "x", 5)):
        with pytest.raises(AdapterError) as info:
            call(protocol, addr, use, model_name="no-such-model")
        assert not info.value.retryable
        assert "no-such-model" in info.value.message


def test_kserve_pins_the_version(servers: dict[str, Proc]) -> None:
    addr = address(servers["fast"], "kserve_v2")
    reply = call("kserve_v2", addr, lambda a: a.generate([IMAGE], PROMPT, "v1", 5), MODEL, "1")
    assert reply.model_version == "1"
    for use in (lambda a: a.describe(5), lambda a: a.generate([IMAGE], PROMPT, "v7", 5)):
        with pytest.raises(AdapterError) as info:
            call("kserve_v2", addr, use, MODEL, "7")
        assert info.value.message.startswith("NOT_FOUND") and "'7'" in info.value.message


def test_kserve_decoupled_models_answer_over_the_stream(servers: dict[str, Proc]) -> None:
    """A Triton vLLM model is decoupled and answers only over ModelStreamInfer; Vigil's server
    serves both RPCs, so the stream path is checked by treating its model as decoupled."""
    addr = address(servers["fast"], "kserve_v2")
    reference = call("kserve_v2", addr, lambda a: a.generate([IMAGE], PROMPT, "unary", 5))

    async def use(adapter: ModelAdapter) -> tuple[object, object]:
        await adapter.describe(5)
        adapter._decoupled = True  # type: ignore[attr-defined]  # what a decoupled config sets
        reply = await adapter.generate([IMAGE], PROMPT, "stream", 5)
        with pytest.raises(AdapterError) as info:
            await adapter.generate([(b"junk", "image/png")], PROMPT, "bad", 5)
        return reply, info.value

    reply, error = call("kserve_v2", addr, use)
    assert reply == reference
    assert "does not decode" in error.message and not error.retryable  # type: ignore[attr-defined]


@pytest.mark.parametrize("protocol", ["kserve_v2", "openai"])
def test_run_through_the_gateway_records_every_item_once(
    tmp_path: Path, benchmark_root: Path, small_benchmark, servers: dict[str, Proc], protocol: str
) -> None:
    stack = Stack(tmp_path / "stack", benchmark_root)
    try:
        gateway = gateway_stub(stack.start_gateway().address)
        gateway.RegisterEndpoint(
            gw.RegisterEndpointRequest(
                endpoint=gw.Endpoint(
                    name=protocol, address=address(servers["fast"], protocol),
                    protocol=PB_PROTOCOL[protocol], max_concurrency=8, model_name=MODEL,
                )
            ),
            timeout=10,
        )  # fmt: skip
        run = gateway.StartRun(
            gw.StartRunRequest(endpoint_name=protocol, benchmark=small_benchmark.id), timeout=30
        ).run
        ended = wait_run(gateway, run.run_id, timeout_s=120)
        assert ended.state == gw.RUN_STATE_SUCCEEDED, ended.error_message
        log = list(gateway.StreamResponses(gw.StreamResponsesRequest(after_seq=0), timeout=30))
    finally:
        stack.close()
    responses = [e.response for e in log if e.HasField("response")]
    items = [r.item_id for r in responses]
    assert len(items) == len(set(items)) == ended.item_count == ended.completed_count > 0
    assert {r.outcome for r in responses} == {gw.OUTCOME_OK}
    assert {r.protocol for r in responses} == {PB_PROTOCOL[protocol]}
    assert {(r.model_name, r.model_version) for r in responses} == {(MODEL, "1")}
    digests = {r.model_config_digest for r in responses}
    assert len(digests) == 1 and len(digests.pop()) == 16
