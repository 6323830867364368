"""The model server as a user runs it: a subprocess per backend on ports the OS chose.

One contract suite, parametrised over the backends: health, Generate, DescribeModel, reflection,
bad input with its status codes and messages, metrics, and a clean exit on SIGTERM.
"""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from model_servers.testing import (
    ServerProcess,
    health_status,
    model_server_command,
    png_bytes,
    server_env,
    start_model_server,
    wait_until_serving,
)
from rpc.client import sync_channel
from vigil.model.v1 import model_pb2, model_pb2_grpc

PROMPT = "Which plane is this slice?\nA. axial\nB. coronal\nC. sagittal\nAnswer: <letter>\nConfidence: <0-100>"
EXPECTED_NAME = {"random": "random-baseline", "hf": "tiny-llava"}


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir: Path) -> Path:
    """The session's tiny LLaVA model (built once, in tests/conftest.py)."""
    return tiny_model_dir


def backend_args(backend: str, tiny_model: Path) -> list[str]:
    if backend == "hf":
        return ["--backend", "hf", "--model-path", str(tiny_model), "--torch-threads", "1"]
    return ["--backend", backend]


@pytest.fixture(scope="module", params=["random", "hf"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tiny_model: Path
) -> Iterator[ServerProcess]:
    backend = request.param
    proc = start_model_server(tmp_path_factory.mktemp(backend), *backend_args(backend, tiny_model))
    proc.notes["backend"] = backend
    # The ready file is written before the model loads: the first answer is NOT_SERVING
    # (the hf backend is still importing torch), then SERVING once the model has loaded.
    proc.notes["first_status"] = health_status(proc.address)
    proc.notes["statuses"] = wait_until_serving(proc.address)
    yield proc
    assert proc.terminate() == 0, proc.stderr()


@pytest.fixture
def stub(server: ServerProcess) -> Iterator[model_pb2_grpc.ModelServiceStub]:
    with sync_channel(server.address) as channel:
        yield model_pb2_grpc.ModelServiceStub(channel)


def generate_request(**fields: object) -> model_pb2.GenerateRequest:
    base: dict[str, object] = {
        "images": [model_pb2.Image(data=png_bytes(), media_type="image/png")],
        "prompt": PROMPT,
        "request_id": "item-1",
    }
    base.update(fields)
    return model_pb2.GenerateRequest(**base)  # type: ignore[arg-type]


def test_health_goes_from_not_serving_to_serving(server: ServerProcess) -> None:
    statuses = server.notes["statuses"]
    assert statuses[-1] == "SERVING"
    if server.notes["backend"] == "hf":
        assert server.notes["first_status"] == "NOT_SERVING"
        assert statuses == ["NOT_SERVING", "SERVING"]
    assert health_status(server.address, "vigil.model.v1.ModelService") == "SERVING"


def test_describe_model(server: ServerProcess, stub: model_pb2_grpc.ModelServiceStub) -> None:
    info = stub.DescribeModel(model_pb2.DescribeModelRequest(), timeout=5)
    backend = server.notes["backend"]
    assert info.ready
    assert info.backend == backend
    assert info.model_name == EXPECTED_NAME[backend]
    assert info.model_version
    assert info.supports_logprobs == (backend == "hf")


def test_generate(server: ServerProcess, stub: model_pb2_grpc.ModelServiceStub) -> None:
    info = stub.DescribeModel(model_pb2.DescribeModelRequest(), timeout=5)
    reply = stub.Generate(generate_request(), timeout=30)
    assert reply.text
    assert reply.prompt_token_count > 0
    assert 0 < reply.completion_token_count <= 32
    assert reply.finish_reason in (model_pb2.FINISH_REASON_STOP, model_pb2.FINISH_REASON_LENGTH)
    assert (reply.model_name, reply.model_version) == (info.model_name, info.model_version)
    assert reply.latency.ToNanoseconds() > 0
    assert list(reply.logprobs) == []
    # Greedy decoding and the seeded baseline both replay an item exactly.
    assert stub.Generate(generate_request(), timeout=30).text == reply.text


def test_generate_text_only_and_token_limit(stub: model_pb2_grpc.ModelServiceStub) -> None:
    reply = stub.Generate(
        generate_request(images=[], parameters=model_pb2.GenerationParameters(max_new_tokens=3)),
        timeout=30,
    )
    assert 0 < reply.completion_token_count <= 3


def test_logprobs_when_offered(
    server: ServerProcess, stub: model_pb2_grpc.ModelServiceStub
) -> None:
    reply = stub.Generate(generate_request(return_logprobs=True), timeout=30)
    if server.notes["backend"] == "hf":
        assert len(reply.logprobs) == reply.completion_token_count
        assert all(lp.logprob <= 0.0 and lp.token for lp in reply.logprobs)
    else:
        assert list(reply.logprobs) == []


def test_reflection_lists_the_model_service(server: ServerProcess) -> None:
    with sync_channel(server.address) as channel:
        services = ProtoReflectionDescriptorDatabase(channel).get_services()
    assert "vigil.model.v1.ModelService" in services
    assert "grpc.health.v1.Health" in services


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {
                "images": [
                    model_pb2.Image(data=png_bytes(), media_type="image/png"),
                    model_pb2.Image(data=b"\x89PNG but not really", media_type="image/png"),
                ]
            },
            "image 1 does not decode",
        ),
        ({"prompt": ""}, "prompt is empty"),
        ({"images": [model_pb2.Image(data=png_bytes(), media_type="image/png")] * 9}, "at most 8"),
        ({"parameters": model_pb2.GenerationParameters(max_new_tokens=-1)}, "max_new_tokens"),
    ],
    ids=["undecodable-image", "empty-prompt", "too-many-images", "negative-token-limit"],
)
def test_bad_input_is_invalid_argument(
    stub: model_pb2_grpc.ModelServiceStub, fields: dict[str, object], message: str
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.Generate(generate_request(**fields), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in info.value.details()


def test_metrics_port_serves_the_counters(
    server: ServerProcess, stub: model_pb2_grpc.ModelServiceStub
) -> None:
    stub.Generate(generate_request(), timeout=30)
    with pytest.raises(grpc.RpcError):
        stub.Generate(generate_request(prompt=" "), timeout=30)
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        body = response.read().decode()
    backend = server.notes["backend"]
    assert f'vigil_model_requests_total{{backend="{backend}",code="OK"}}' in body
    assert f'vigil_model_requests_total{{backend="{backend}",code="INVALID_ARGUMENT"}}' in body
    assert f'vigil_model_generate_latency_seconds_count{{backend="{backend}"}}' in body
    assert f'vigil_model_ready{{backend="{backend}"}} 1.0' in body
    assert "axial" not in body  # no request content in metrics


def test_logs_name_request_ids_not_prompts(server: ServerProcess) -> None:
    log = server.stderr()
    assert "request_id=item-1" in log
    assert "Which plane" not in log and "sagittal" not in log


def test_sigterm_exits_zero(tmp_path: Path) -> None:
    proc = start_model_server(tmp_path, "--backend", "random")
    wait_until_serving(proc.address)
    started = time.monotonic()
    assert proc.terminate(timeout=5) == 0, proc.stderr()
    assert time.monotonic() - started < 5


def test_sigterm_while_loading_exits_zero(tmp_path: Path, tiny_model: Path) -> None:
    proc = start_model_server(tmp_path, "--backend", "hf", "--model-path", str(tiny_model))
    assert health_status(proc.address) == "NOT_SERVING"
    assert proc.terminate(timeout=5) == 0, proc.stderr()


def run_to_exit(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        model_server_command("--port", "0", "--metrics-port", "0", *args),
        env=server_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_missing_model_path_exits_nonzero_with_one_clear_line(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    done = run_to_exit("--backend", "hf", "--model-path", str(missing))
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert str(missing) in last and "does not exist" in last
    assert "Traceback" not in done.stderr


def test_folder_that_is_not_a_model_exits_nonzero(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "no-such-architecture"}')
    done = run_to_exit("--backend", "hf", "--model-path", str(tmp_path))
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("vigil serve model: error: cannot load model from " + str(tmp_path))
    assert "Traceback" not in done.stderr


def test_hf_without_model_path_exits_nonzero() -> None:
    done = run_to_exit("--backend", "hf")
    assert done.returncode != 0
    assert "--model-path" in done.stderr.strip().splitlines()[-1]


def test_port_in_use_exits_nonzero_with_one_clear_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            model_server_command("--port", str(port), "--metrics-port", "0"),
            env=server_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr.strip().splitlines()[-1]
    assert "Traceback" not in done.stderr
