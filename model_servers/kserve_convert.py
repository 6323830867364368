"""KServe v2 / Triton tensors <-> the model server's domain types; field mapping and checks only.

The tensors follow the conventions of Triton's vLLM backend (DESIGN.md, "Contracts"):

inputs
    ``text_input`` BYTES [1], the prompt (required).
    ``image`` BYTES [N], one base64-encoded image file per element (optional; a data URL prefix
    such as ``data:image/png;base64,`` is accepted and dropped).
    ``sampling_parameters`` BYTES [1], JSON such as ``{"max_tokens": 32, "temperature": 0}``
    (optional). ``max_tokens`` is the new-token limit; the backends decode greedily, so the other
    keys are accepted and ignored.
    ``exclude_input_in_output`` BOOL [1] (optional, default false). As in the vLLM backend, when it
    is false ``text_output`` starts with the prompt.
    ``return_logprobs``, ``return_num_output_tokens``, ``return_num_input_tokens``,
    ``return_finish_reason`` BOOL [1] (optional, default false); ``stream`` BOOL [1] (optional;
    only false is served).

outputs
    ``text_output`` BYTES [1]; when asked, ``logprobs`` BYTES [1]: JSON, a list with one object
    per generated token, ``{"token": str, "logprob": float}`` (an empty list when the backend
    offers none); ``num_output_tokens`` / ``num_input_tokens`` UINT32 [1];
    ``finish_reason`` BYTES [1] (``stop`` or ``length``).

Every tensor may come typed (``contents``) or raw (``raw_input_contents``, one entry per input,
in the order of ``inputs``; BYTES elements are a 4-byte little-endian length and the bytes).
A bad tensor is ``InvalidArgument`` whose message names it.

Versions: Triton model versions are integers written as strings. A backend whose version is
such an integer (the random baseline's ``"1"``) is served as that version; any other version
string (the ``hf`` backend's weight hash) is served as version ``"1"`` and published in the model
config's parameter ``vigil_model_version``, so a swapped model still changes the config digest.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tritonclient.grpc import model_config_pb2, service_pb2

from model_servers.backends.base import GenerationInput, ModelInfo
from model_servers.runtime import Generation
from rpc.errors import InvalidArgument, NotFound

DEFAULT_TRITON_VERSION = "1"

# name -> (datatype, optional, element count: 1 for a scalar, None for any)
_INPUTS: dict[str, tuple[str, bool, int | None]] = {
    "text_input": ("BYTES", False, 1),
    "image": ("BYTES", True, None),
    "sampling_parameters": ("BYTES", True, 1),
    "exclude_input_in_output": ("BOOL", True, 1),
    "stream": ("BOOL", True, 1),
    "return_logprobs": ("BOOL", True, 1),
    "return_num_input_tokens": ("BOOL", True, 1),
    "return_num_output_tokens": ("BOOL", True, 1),
    "return_finish_reason": ("BOOL", True, 1),
}
_OUTPUTS: dict[str, str] = {
    "text_output": "BYTES",
    "logprobs": "BYTES",
    "num_input_tokens": "UINT32",
    "num_output_tokens": "UINT32",
    "finish_reason": "BYTES",
}
_CONFIG_TYPES = {
    "BYTES": model_config_pb2.TYPE_STRING,
    "BOOL": model_config_pb2.TYPE_BOOL,
    "UINT32": model_config_pb2.TYPE_UINT32,
}


def triton_version(info: ModelInfo) -> str:
    """The integer version string a Triton client sees for ``info`` (see the module docstring)."""
    version = info.model_version
    return version if version.isdigit() else DEFAULT_TRITON_VERSION


def check_model(info: ModelInfo, name: str, version: str) -> None:
    """NotFound unless ``name`` (and ``version``, when given) address the served model."""
    if name != info.model_name:
        raise NotFound(f"unknown model {name!r}; this server serves {info.model_name!r}")
    if version and version != triton_version(info):
        raise NotFound(
            f"unknown version {version!r} of model {name!r}; served: {triton_version(info)!r}"
        )


# Decoding tensors ----------------------------------------------------------------------------


def _split_bytes(name: str, raw: bytes) -> list[bytes]:
    """The elements of a serialised BYTES tensor: 4-byte little-endian length, then the bytes."""
    out: list[bytes] = []
    offset, size = 0, len(raw)
    while offset < size:
        if offset + 4 > size:
            raise InvalidArgument(f"input {name!r}: raw BYTES content is truncated")
        (length,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + length > size:
            raise InvalidArgument(
                f"input {name!r}: an element of {length} bytes runs past the raw content"
            )
        out.append(raw[offset : offset + length])
        offset += length
    return out


def _element_count(name: str, shape: Sequence[int]) -> int:
    count = 1
    for dim in shape:
        if dim < 0:
            raise InvalidArgument(f"input {name!r}: shape {list(shape)} has a negative dimension")
        count *= dim
    return count


def _decode(tensor: Any, raw: bytes | None) -> list[Any]:
    """The elements of one input tensor, checked against its declared datatype and shape."""
    name = tensor.name
    datatype, _optional, scalar = _INPUTS[name]
    if tensor.datatype != datatype:
        raise InvalidArgument(f"input {name!r} must be {datatype}, got {tensor.datatype or '?'}")
    shape = list(tensor.shape)
    if scalar == 1 and shape != [1]:
        raise InvalidArgument(f"input {name!r} must have shape [1], got {shape}")
    if scalar is None and len(shape) != 1:
        raise InvalidArgument(f"input {name!r} must have shape [N], got {shape}")
    count = _element_count(name, shape)
    values: list[Any]
    if raw is not None:
        if datatype == "BYTES":
            values = _split_bytes(name, raw)
        else:  # BOOL: one byte per element
            if len(raw) != count:
                raise InvalidArgument(
                    f"input {name!r}: raw content has {len(raw)} bytes, shape {shape} needs {count}"
                )
            values = [b != 0 for b in raw]
    elif datatype == "BYTES":
        values = list(tensor.contents.bytes_contents)
    else:
        values = list(tensor.contents.bool_contents)
    if len(values) != count:
        raise InvalidArgument(
            f"input {name!r} holds {len(values)} elements, shape {shape} needs {count}"
        )
    return values


def decode_inputs(request: service_pb2.ModelInferRequest) -> dict[str, list[Any]]:
    """Every input by name, decoded and checked; unknown, repeated or missing inputs are refused."""
    raws = list(request.raw_input_contents)
    if raws and len(raws) != len(request.inputs):
        raise InvalidArgument(
            f"raw_input_contents has {len(raws)} entries for {len(request.inputs)} inputs"
        )
    decoded: dict[str, list[Any]] = {}
    for index, tensor in enumerate(request.inputs):
        if tensor.name not in _INPUTS:
            raise InvalidArgument(
                f"unexpected input {tensor.name!r}; known inputs: {', '.join(_INPUTS)}"
            )
        if tensor.name in decoded:
            raise InvalidArgument(f"input {tensor.name!r} is given twice")
        decoded[tensor.name] = _decode(tensor, raws[index] if raws else None)
    for name, (_datatype, optional, _scalar) in _INPUTS.items():
        if not optional and name not in decoded:
            raise InvalidArgument(f"input {name!r} is missing")
    return decoded


def _flag(inputs: dict[str, list[Any]], name: str) -> bool:
    values = inputs.get(name)
    return bool(values[0]) if values else False


def _image(index: int, value: bytes) -> bytes:
    text = value
    if text.startswith(b"data:"):
        _, _, text = text.partition(b",")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidArgument(f"input 'image' element {index} is not base64") from None


def _max_tokens(raw: bytes, default: int) -> int:
    try:
        params = json.loads(raw.decode("utf-8")) if raw.strip() else {}
    except (UnicodeDecodeError, ValueError):
        raise InvalidArgument("input 'sampling_parameters' is not JSON") from None
    if not isinstance(params, dict):
        raise InvalidArgument("input 'sampling_parameters' must be a JSON object")
    value = params.get("max_tokens", default)
    if isinstance(value, str) and value.isdigit():  # vLLM's own clients send strings
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(
            f"input 'sampling_parameters': max_tokens must be a positive integer, got {value!r}"
        )
    return value


@dataclass(frozen=True)
class InferRequest:
    """A decoded ModelInfer request: the generation and what the caller asked to get back."""

    generation: GenerationInput
    exclude_input: bool
    outputs: set[str] = field(default_factory=set)


def infer_request(request: service_pb2.ModelInferRequest, default_max_tokens: int) -> InferRequest:
    """Decode and check ``request`` (the model name and version are checked by the caller)."""
    inputs = decode_inputs(request)
    if _flag(inputs, "stream"):
        raise InvalidArgument("input 'stream': streaming is not served; send false or omit it")
    try:
        prompt = inputs["text_input"][0].decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgument("input 'text_input' is not UTF-8") from None
    images = [_image(i, value) for i, value in enumerate(inputs.get("image", []))]
    sampling = inputs.get("sampling_parameters")
    max_tokens = _max_tokens(sampling[0], default_max_tokens) if sampling else default_max_tokens
    for requested in request.outputs:
        if requested.name not in _OUTPUTS:
            raise InvalidArgument(
                f"unknown output {requested.name!r}; known outputs: {', '.join(_OUTPUTS)}"
            )
    outputs = {"text_output"}
    for name in ("logprobs", "num_input_tokens", "num_output_tokens", "finish_reason"):
        if _flag(inputs, f"return_{name}"):
            outputs.add(name)
    generation = GenerationInput(
        images=images,
        media_types=["" for _ in images],
        prompt=prompt,
        max_new_tokens=max_tokens,
        return_logprobs="logprobs" in outputs,
        request_id=request.id,
    )
    return InferRequest(generation, _flag(inputs, "exclude_input_in_output"), outputs)


def tensor_name_for(message: str) -> str:
    """The input a runtime check's message is about (the runtime speaks of images and prompts)."""
    if message.startswith(("image", "request has")):
        return "image"
    if message.startswith("max_new_tokens"):
        return "sampling_parameters"
    return "text_input"


# Encoding the answer --------------------------------------------------------------------------


def _bytes_element(value: bytes) -> bytes:
    return struct.pack("<I", len(value)) + value


def infer_response(
    request: service_pb2.ModelInferRequest, decoded: InferRequest, generation: Generation
) -> service_pb2.ModelInferResponse:
    """The ModelInfer answer, with raw output contents as Triton sends them."""
    output = generation.output
    text = output.text if decoded.exclude_input else decoded.generation.prompt + output.text
    values: dict[str, bytes] = {"text_output": _bytes_element(text.encode("utf-8"))}
    if "logprobs" in decoded.outputs:
        logprobs = [{"token": t, "logprob": lp} for t, lp in output.logprobs]
        values["logprobs"] = _bytes_element(json.dumps(logprobs).encode("utf-8"))
    if "num_output_tokens" in decoded.outputs:
        values["num_output_tokens"] = struct.pack("<I", output.completion_token_count)
    if "num_input_tokens" in decoded.outputs:
        values["num_input_tokens"] = struct.pack("<I", output.prompt_token_count)
    if "finish_reason" in decoded.outputs:
        values["finish_reason"] = _bytes_element(output.finish_reason.encode("utf-8"))
    wanted = [o.name for o in request.outputs] or list(values)
    response = service_pb2.ModelInferResponse(
        model_name=generation.info.model_name,
        model_version=triton_version(generation.info),
        id=request.id,
    )
    for name in wanted:
        if name not in values:
            continue  # asked for an output without asking for its content (return_* false)
        response.outputs.add(name=name, datatype=_OUTPUTS[name], shape=[1])
        response.raw_output_contents.append(values[name])
    return response


# Metadata and configuration -------------------------------------------------------------------


def model_metadata(info: ModelInfo) -> service_pb2.ModelMetadataResponse:
    """The tensors of the served model, as ModelMetadata lists them."""
    tensor = service_pb2.ModelMetadataResponse.TensorMetadata
    return service_pb2.ModelMetadataResponse(
        name=info.model_name,
        versions=[triton_version(info)],
        platform="vigil",
        inputs=[
            tensor(name=name, datatype=datatype, shape=[1] if scalar == 1 else [-1])
            for name, (datatype, _optional, scalar) in _INPUTS.items()
        ],
        outputs=[
            tensor(name=name, datatype=datatype, shape=[-1]) for name, datatype in _OUTPUTS.items()
        ],
    )


def model_config(info: ModelInfo) -> model_config_pb2.ModelConfig:
    """A Triton model config for the served model: the vLLM backend's tensors, no batching."""
    config = model_config_pb2.ModelConfig(
        name=info.model_name,
        backend="vigil",
        max_batch_size=0,
        version_policy=model_config_pb2.ModelVersionPolicy(
            specific=model_config_pb2.ModelVersionPolicy.Specific(
                versions=[int(triton_version(info))]
            )
        ),
        input=[
            model_config_pb2.ModelInput(
                name=name,
                data_type=_CONFIG_TYPES[datatype],  # type: ignore[arg-type]
                dims=[1] if scalar == 1 else [-1],
                optional=optional,
            )
            for name, (datatype, optional, scalar) in _INPUTS.items()
        ],
        output=[
            model_config_pb2.ModelOutput(
                name=name,
                data_type=_CONFIG_TYPES[datatype],  # type: ignore[arg-type]
                dims=[-1],
            )
            for name, datatype in _OUTPUTS.items()
        ],
    )
    config.parameters["vigil_backend"].string_value = info.backend
    config.parameters["vigil_model_version"].string_value = info.model_version
    config.parameters["vigil_supports_logprobs"].string_value = str(info.supports_logprobs).lower()
    return config
