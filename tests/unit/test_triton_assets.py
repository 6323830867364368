"""The Triton model-repository example parses with the model-config protobuf tritonclient ships,
and its tensors follow the vLLM-backend conventions that Vigil's server and adapter use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from gateway.adapters.kserve import prompt_text
from model_servers.backends.base import ModelInfo
from model_servers.kserve_convert import model_config

REPOSITORY = Path(__file__).resolve().parents[2] / "model_servers" / "triton" / "model_repository"
MODELS = sorted(p for p in REPOSITORY.iterdir() if p.is_dir())

# name -> (data type, dims, optional)
INPUTS = {
    "text_input": (mc.TYPE_STRING, [1], False),
    "image": (mc.TYPE_STRING, [-1], True),
    "sampling_parameters": (mc.TYPE_STRING, [1], True),
    "exclude_input_in_output": (mc.TYPE_BOOL, [1], True),
    "return_logprobs": (mc.TYPE_BOOL, [1], True),
    "return_num_output_tokens": (mc.TYPE_BOOL, [1], True),
}
OUTPUTS = {
    "text_output": mc.TYPE_STRING,
    "logprobs": mc.TYPE_STRING,
    "num_output_tokens": mc.TYPE_UINT32,
}


def parse(folder: Path) -> mc.ModelConfig:
    return text_format.Parse((folder / "config.pbtxt").read_text(), mc.ModelConfig())


def test_the_repository_holds_a_model() -> None:
    assert [p.name for p in MODELS] == ["medgemma_4b_it"]


@pytest.mark.parametrize("folder", MODELS, ids=lambda p: p.name)
def test_config_follows_the_vllm_backend_conventions(folder: Path) -> None:
    config = parse(folder)
    assert config.name == folder.name
    assert config.backend == "vllm" and config.max_batch_size == 0
    assert config.model_transaction_policy.decoupled
    assert list(config.version_policy.specific.versions) == [1]
    inputs = {i.name: (i.data_type, list(i.dims), i.optional) for i in config.input}
    for name, expected in INPUTS.items():
        assert inputs[name] == expected, name
    outputs = {o.name: o.data_type for o in config.output}
    for name, expected_type in OUTPUTS.items():
        assert outputs[name] == expected_type, name
    template = config.parameters["vigil_prompt_template"].string_value
    assert "{prompt}" in template and "{images}" in template
    assert config.parameters["vigil_image_token"].string_value


@pytest.mark.parametrize("folder", MODELS, ids=lambda p: p.name)
def test_vigil_server_reports_the_same_tensors(folder: Path) -> None:
    """Vigil's KServe v2 service and this Triton config agree on every tensor both declare."""
    example = parse(folder)
    ours = model_config(ModelInfo("m", "1", "random", supports_logprobs=False))
    ours_in = {i.name: i.data_type for i in ours.input}
    ours_out = {o.name: o.data_type for o in ours.output}
    assert set(INPUTS) <= set(ours_in) and set(OUTPUTS) <= set(ours_out)
    for tensor in example.input:
        if tensor.name in ours_in:
            assert ours_in[tensor.name] == tensor.data_type, tensor.name
    for tensor in example.output:
        if tensor.name in ours_out:
            assert ours_out[tensor.name] == tensor.data_type, tensor.name


@pytest.mark.parametrize("folder", MODELS, ids=lambda p: p.name)
def test_engine_arguments(folder: Path) -> None:
    versions = [p for p in folder.iterdir() if p.is_dir()]
    assert [p.name for p in versions] == ["1"]
    engine = json.loads((folder / "1" / "model.json").read_text())
    assert engine["model"] == "google/medgemma-4b-it"
    assert engine["limit_mm_per_prompt"]["image"] >= 1
    assert 0 < engine["gpu_memory_utilization"] <= 1


@pytest.mark.parametrize("folder", MODELS, ids=lambda p: p.name)
def test_prompt_template_gives_a_gemma_turn_with_one_placeholder_per_image(folder: Path) -> None:
    params = parse(folder).parameters
    template = params["vigil_prompt_template"].string_value
    token = params["vigil_image_token"].string_value
    text = prompt_text(template, token, "Which plane?", 1)
    assert text == (
        "<start_of_turn>user\n<start_of_image>Which plane?<end_of_turn>\n<start_of_turn>model\n"
    )
    assert prompt_text(template, token, "Which plane?", 0).count(token) == 0
    assert prompt_text("", token, "Which plane?", 1) == "Which plane?"
