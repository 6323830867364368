"""The model server's KServe v2 / Triton service, called with raw tritonclient calls and raw
protobuf: the vLLM-backend tensors, bad tensors and bad images with their status codes and
messages, and the server serving on after them. Plus the loading window, in-process."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from model_servers.main import serve
from model_servers.settings import ModelServerSettings
from model_servers.testing import (
    GatedBackend,
    ServerProcess,
    health_status,
    png_bytes,
    start_model_server,
    wait_until_serving,
)
from rpc.client import aio_channel, sync_channel

MODEL = "random-baseline"
PROMPT = "Which plane is this slice?\nA. axial\nB. coronal\nC. sagittal"
SERVICE = "inference.GRPCInferenceService"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = start_model_server(tmp_path_factory.mktemp("kserve"), "--backend", "random")
    wait_until_serving(proc.address)
    yield proc
    assert proc.terminate() == 0, proc.stderr()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[triton.InferenceServerClient]:
    with triton.InferenceServerClient(server.address) as c:
        yield c


@pytest.fixture(scope="module")
def stub(server: ServerProcess) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    with sync_channel(server.address) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def bytes_input(name: str, values: list[bytes]) -> triton.InferInput:
    tensor = triton.InferInput(name, [len(values)], "BYTES")
    tensor.set_data_from_numpy(np.array(values, dtype=np.object_))
    return tensor


def bool_input(name: str, value: bool) -> triton.InferInput:
    tensor = triton.InferInput(name, [1], "BOOL")
    tensor.set_data_from_numpy(np.array([value]))
    return tensor


def vllm_inputs(prompt: str = PROMPT, images: list[bytes] | None = None) -> list[triton.InferInput]:
    inputs = [bytes_input("text_input", [prompt.encode()])]
    if images is None:
        images = [png_bytes()]
    if images:
        inputs.append(bytes_input("image", [base64.b64encode(i) for i in images]))
    inputs.append(bytes_input("sampling_parameters", [b'{"max_tokens": 32, "temperature": 0}']))
    inputs.append(bool_input("exclude_input_in_output", True))
    return inputs


def text_of(result: triton.InferResult) -> str:
    return result.as_numpy("text_output")[0].decode()


def raw_bytes(*values: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(v)) + v for v in values)


def tensor(
    name: str, datatype: str, shape: list[int]
) -> service_pb2.ModelInferRequest.InferInputTensor:
    return service_pb2.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=shape)


def raw_request(
    inputs: list[tuple[str, str, list[int], bytes]], model: str = MODEL
) -> service_pb2.ModelInferRequest:
    return service_pb2.ModelInferRequest(
        model_name=model,
        id="raw-1",
        inputs=[tensor(n, d, s) for n, d, s, _ in inputs],
        raw_input_contents=[raw for *_, raw in inputs],
    )


GOOD_TEXT = ("text_input", "BYTES", [1], raw_bytes(PROMPT.encode()))
GOOD_IMAGE = ("image", "BYTES", [1], raw_bytes(base64.b64encode(png_bytes())))


def test_server_and_model_metadata(
    server: ServerProcess, client: triton.InferenceServerClient
) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready(MODEL) and client.is_model_ready(MODEL, "1")
    assert client.get_server_metadata().name == "vigil"
    metadata = client.get_model_metadata(MODEL)
    assert (metadata.name, list(metadata.versions)) == (MODEL, ["1"])
    inputs = {t.name: (t.datatype, list(t.shape)) for t in metadata.inputs}
    assert inputs["text_input"] == ("BYTES", [1]) and inputs["image"] == ("BYTES", [-1])
    assert inputs["exclude_input_in_output"] == ("BOOL", [1])
    config = client.get_model_config(MODEL).config
    assert (config.backend, config.max_batch_size) == ("vigil", 0)
    types = {i.name: i.data_type for i in config.input}
    assert types["text_input"] == model_config_pb2.TYPE_STRING
    assert types["return_logprobs"] == model_config_pb2.TYPE_BOOL
    assert {o.name: o.data_type for o in config.output}["num_output_tokens"] == (
        model_config_pb2.TYPE_UINT32
    )
    assert config.parameters["vigil_model_version"].string_value == "1"
    index = client.get_model_repository_index()
    assert [(m.name, m.version, m.state) for m in index.models] == [(MODEL, "1", "READY")]
    assert health_status(server.address, SERVICE) == "SERVING"
    with sync_channel(server.address) as channel:
        services = ProtoReflectionDescriptorDatabase(channel).get_services()
    assert SERVICE in services and "vigil.model.v1.ModelService" in services


def test_infer_with_the_vllm_tensors(client: triton.InferenceServerClient) -> None:
    inputs = vllm_inputs()
    inputs += [bool_input("return_num_output_tokens", True), bool_input("return_logprobs", True)]
    result = client.infer(MODEL, inputs, request_id="t-1")
    response = result.get_response()
    assert (response.model_name, response.model_version, response.id) == (MODEL, "1", "t-1")
    text = text_of(result)
    assert "Answer:" in text and not text.startswith(PROMPT)
    assert result.as_numpy("num_output_tokens").dtype == np.uint32
    assert int(result.as_numpy("num_output_tokens")[0]) == len(text.split())
    assert json.loads(result.as_numpy("logprobs")[0]) == []  # the baseline offers none
    # Replayed exactly; pinned to version 1; without exclude_input_in_output the prompt leads.
    assert text_of(client.infer(MODEL, vllm_inputs(), model_version="1")) == text
    echoed = client.infer(MODEL, vllm_inputs()[:-1])
    assert text_of(echoed) == PROMPT + text
    # Text only.
    assert "Answer:" in text_of(client.infer(MODEL, vllm_inputs(images=[])))


def test_typed_contents_answer_like_raw_contents(
    client: triton.InferenceServerClient, stub: service_pb2_grpc.GRPCInferenceServiceStub
) -> None:
    typed = service_pb2.ModelInferRequest(model_name=MODEL, inputs=[
        tensor("text_input", "BYTES", [1]), tensor("image", "BYTES", [1]),
        tensor("exclude_input_in_output", "BOOL", [1]),
    ])  # fmt: skip
    typed.inputs[0].contents.bytes_contents.append(PROMPT.encode())
    typed.inputs[1].contents.bytes_contents.append(base64.b64encode(png_bytes()))
    typed.inputs[2].contents.bool_contents.append(True)
    reply = stub.ModelInfer(typed, timeout=10)
    assert reply.raw_output_contents[0][4:].decode() == text_of(client.infer(MODEL, vllm_inputs()))


@pytest.mark.parametrize(
    ("inputs", "code", "message"),
    [
        ([GOOD_IMAGE], "INVALID_ARGUMENT", "input 'text_input' is missing"),
        ([("text_input", "INT32", [1], b"\0\0\0\0")], "INVALID_ARGUMENT", "'text_input' must be BYTES"),
        ([("text_input", "BYTES", [2], raw_bytes(b"a", b"b"))], "INVALID_ARGUMENT", "'text_input' must have shape [1]"),
        ([("text_input", "BYTES", [1], raw_bytes(b"a", b"b"))], "INVALID_ARGUMENT", "'text_input' holds 2 elements"),
        ([("text_input", "BYTES", [1], struct.pack("<I", 99) + b"short")], "INVALID_ARGUMENT", "'text_input': an element of 99 bytes"),
        ([GOOD_TEXT, ("exclude_input_in_output", "BOOL", [1], b"\1\1")], "INVALID_ARGUMENT", "'exclude_input_in_output': raw content has 2 bytes"),
        ([GOOD_TEXT, ("image", "BYTES", [1], raw_bytes(b"not base64!"))], "INVALID_ARGUMENT", "'image' element 0 is not base64"),
        ([GOOD_TEXT, ("image", "BYTES", [1], raw_bytes(base64.b64encode(b"\x89PNG junk")))], "INVALID_ARGUMENT", "'image': image 0 does not decode"),
        ([GOOD_TEXT, ("image", "BYTES", [1, 1], raw_bytes(b"x"))], "INVALID_ARGUMENT", "'image' must have shape [N]"),
        ([GOOD_TEXT, ("sampling_parameters", "BYTES", [1], raw_bytes(b"{max"))], "INVALID_ARGUMENT", "'sampling_parameters' is not JSON"),
        ([GOOD_TEXT, ("sampling_parameters", "BYTES", [1], raw_bytes(b'{"max_tokens": 0}'))], "INVALID_ARGUMENT", "max_tokens must be a positive integer"),
        ([GOOD_TEXT, ("bogus", "BYTES", [1], raw_bytes(b"x"))], "INVALID_ARGUMENT", "unexpected input 'bogus'"),
        ([("text_input", "BYTES", [1], raw_bytes(b"   "))], "INVALID_ARGUMENT", "'text_input': prompt is empty"),
    ],
    ids=[
        "missing-text", "wrong-datatype", "wrong-shape", "element-count", "byte-size-overrun",
        "bool-byte-size", "image-not-base64", "image-not-an-image", "image-shape", "bad-json",
        "bad-max-tokens", "unknown-input", "empty-prompt",
    ],
)  # fmt: skip
def test_bad_tensors_are_invalid_argument_naming_the_tensor(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
    client: triton.InferenceServerClient,
    inputs: list[tuple[str, str, list[int], bytes]],
    code: str,
    message: str,
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(raw_request(inputs), timeout=10)
    assert info.value.code().name == code
    assert message in info.value.details()
    # ...and the server keeps serving.
    assert client.is_server_ready()
    assert "Answer:" in text_of(client.infer(MODEL, vllm_inputs()))


def test_raw_contents_must_match_the_inputs(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    request = raw_request([GOOD_TEXT, GOOD_IMAGE])
    request.raw_input_contents.pop()
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "raw_input_contents has 1 entries for 2 inputs" in info.value.details()


def test_unknown_model_or_version_is_not_found(client: triton.InferenceServerClient) -> None:
    for call in (
        lambda: client.infer("no-such-model", vllm_inputs()),
        lambda: client.infer(MODEL, vllm_inputs(), model_version="2"),
        lambda: client.get_model_config("no-such-model"),
        lambda: client.get_model_metadata(MODEL, "2"),
        lambda: client.is_model_ready("no-such-model"),
    ):
        with pytest.raises(triton.InferenceServerException) as info:
            call()
        assert info.value.status() == "StatusCode.NOT_FOUND"
    assert client.is_model_ready(MODEL)


def test_unserved_rpcs_are_unimplemented(client: triton.InferenceServerClient) -> None:
    with pytest.raises(triton.InferenceServerException) as info:
        client.get_inference_statistics()
    assert info.value.status() == "StatusCode.UNIMPLEMENTED"


def test_stream_infer_answers_each_request_and_survives_errors(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    good = raw_request([GOOD_TEXT, GOOD_IMAGE, ("exclude_input_in_output", "BOOL", [1], b"\1")])
    bad = raw_request([GOOD_IMAGE])
    replies = list(stub.ModelStreamInfer(iter([good, bad, good]), timeout=10))
    assert [bool(r.error_message) for r in replies] == [False, True, False]
    assert "'text_input' is missing" in replies[1].error_message
    first, last = replies[0].infer_response, replies[2].infer_response
    assert first.raw_output_contents == last.raw_output_contents
    assert first.parameters["triton_final_response"].bool_param


def test_loading_is_unavailable_on_every_protocol(tmp_path: Path) -> None:
    """While the model loads: ModelInfer UNAVAILABLE, not ready, and the OpenAI endpoint 503."""
    import aiohttp

    backend = GatedBackend()
    settings = ModelServerSettings(
        port=0, metrics_port=0, openai_port=0, ready_file=tmp_path / "ready.json"
    )

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(serve(settings, backend=backend, stop=stop))
        for _ in range(500):
            if settings.ready_file.exists() or task.done():  # type: ignore[union-attr]
                break
            await asyncio.sleep(0.01)
        ports = json.loads((tmp_path / "ready.json").read_text())
        async with aio_channel(f"127.0.0.1:{ports['grpc_port']}") as channel:
            kserve = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            assert (await kserve.ServerLive(service_pb2.ServerLiveRequest(), timeout=2)).live
            assert not (await kserve.ServerReady(service_pb2.ServerReadyRequest(), timeout=2)).ready
            ready = await kserve.ModelReady(service_pb2.ModelReadyRequest(name=MODEL), timeout=2)
            assert not ready.ready
            for rpc, request in (
                (kserve.ModelInfer, raw_request([GOOD_TEXT])),
                (kserve.ModelConfig, service_pb2.ModelConfigRequest(name=MODEL)),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await rpc(request, timeout=2)
                assert info.value.code() == grpc.StatusCode.UNAVAILABLE
                assert info.value.details() == "model is loading"
            base = f"http://127.0.0.1:{ports['openai_port']}"
            async with aiohttp.ClientSession() as http:
                async with http.get(f"{base}/v1/models") as response:
                    assert response.status == 503
                    assert (await response.json())["error"]["message"] == "model is loading"
                body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}]}
                async with http.post(f"{base}/v1/chat/completions", json=body) as response:
                    assert response.status == 503
            backend.release_load.set()
            for _ in range(300):
                if (await kserve.ServerReady(service_pb2.ServerReadyRequest(), timeout=2)).ready:
                    break
                await asyncio.sleep(0.01)
            reply = await kserve.ModelInfer(raw_request([GOOD_TEXT]), timeout=5)
            assert reply.model_name == MODEL
        stop.set()
        await asyncio.wait_for(task, timeout=10)

    asyncio.run(scenario())
