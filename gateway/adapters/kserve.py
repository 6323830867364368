"""Adapter for KServe v2 / Triton servers (``inference.GRPCInferenceService``) via ``tritonclient``.

It speaks the tensor conventions of Triton's vLLM backend (DESIGN.md, "Contracts"): the prompt in
``text_input``, each image base64-encoded as one element of ``image``, ``sampling_parameters`` as
JSON, ``exclude_input_in_output`` true, the answer in ``text_output``.

``describe`` resolves the model (the endpoint's ``model_name``, or the only model the repository
index lists), checks ModelReady for the pinned version (the endpoint's ``model_version``; empty
lets the server pick its latest), and fetches ModelMetadata and ModelConfig. Every reply records
the model name and version the server says answered and a digest of that model's config, so a
model swapped behind the same name shows in the log; when a reply names a model or version other
than the one described, the config is fetched again for it.

The model config may carry two parameters that help audit a real deployment unchanged:
``vigil_prompt_template`` (the text sent, with ``{prompt}`` and ``{images}`` in it: the vLLM backend
passes ``text_input`` to the engine verbatim, so a chat template must be applied by the caller) and
``vigil_image_token`` (what ``{images}`` becomes once per image). A decoupled model (the vLLM
backend always is) cannot answer the unary ModelInfer, so its requests go over ModelStreamInfer.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json

import numpy as np
from tritonclient.grpc import InferInput, InferRequestedOutput, model_config_pb2, service_pb2
from tritonclient.grpc.aio import InferenceServerClient
from tritonclient.utils import InferenceServerException

from gateway.adapters.base import AdapterError, AdapterTarget, ModelIdentity, ModelReply
from rpc.client import CHANNEL_OPTIONS

MAX_TOKENS = 64
"""New-token limit sent in ``sampling_parameters`` (vLLM's own default, 16, cuts an answer and
its confidence short)."""

_RETRYABLE = {"StatusCode.UNAVAILABLE", "StatusCode.RESOURCE_EXHAUSTED"}
SAMPLING_PARAMETERS = json.dumps({"max_tokens": MAX_TOKENS, "temperature": 0}).encode("utf-8")


def _error(exc: InferenceServerException) -> AdapterError:
    status = exc.status() or ""
    code = status.removeprefix("StatusCode.") or "ERROR"
    return AdapterError(
        f"{code}: {exc.message() or 'no details'}",
        timeout=status == "StatusCode.DEADLINE_EXCEEDED",
        retryable=status in _RETRYABLE,
    )


def config_digest(config: model_config_pb2.ModelConfig) -> str:
    """The first 16 hex digits of a SHA-256 over the config's deterministic serialisation."""
    return hashlib.sha256(config.SerializeToString(deterministic=True)).hexdigest()[:16]


def _latest(versions: list[str]) -> str:
    numeric = [v for v in versions if v.isdigit()]
    if numeric:
        return max(numeric, key=int)
    return versions[-1] if versions else ""


def bytes_input(name: str, values: list[bytes]) -> InferInput:
    tensor = InferInput(name, [len(values)], "BYTES")
    tensor.set_data_from_numpy(np.array(values, dtype=np.object_))
    return tensor


def bool_input(name: str, value: bool) -> InferInput:
    tensor = InferInput(name, [1], "BOOL")
    tensor.set_data_from_numpy(np.array([value], dtype=np.bool_))
    return tensor


def prompt_text(template: str, image_token: str, prompt: str, image_count: int) -> str:
    """The ``text_input`` for ``prompt``: the model config's template (``{images}``, then
    ``{prompt}``) filled in, or the prompt itself when the config has none."""
    if not template:
        return prompt
    return template.replace("{images}", image_token * image_count).replace("{prompt}", prompt)


class KServeAdapter:
    """Calls one model on a KServe v2 / Triton server over one shared asyncio channel."""

    protocol = "kserve_v2"

    def __init__(self, target: AdapterTarget) -> None:
        self.address = target.address
        self._target = target
        self._client: InferenceServerClient | None = None
        self._lock = asyncio.Lock()
        self._name = ""
        self._version = ""
        self._digest = ""
        self._template = ""
        self._image_token = ""
        self._decoupled = False
        # The same for every request; InferInput is only read when a request is built.
        self._fixed_inputs = [
            bytes_input("sampling_parameters", [SAMPLING_PARAMETERS]),
            bool_input("exclude_input_in_output", True),
        ]

    @property
    def client(self) -> InferenceServerClient:
        # Made on first use, inside the event loop (an adapter built only to check the protocol
        # opens no channel).
        if self._client is None:
            self._client = InferenceServerClient(self.address, channel_args=CHANNEL_OPTIONS)
        return self._client

    async def _discover(self, timeout_s: float) -> str:
        index = await self.client.get_model_repository_index(client_timeout=timeout_s)
        names = sorted({m.name for m in index.models if m.state in ("", "READY")})
        if len(names) > 1:
            raise AdapterError(
                f"the server serves several models ({', '.join(names)}); "
                "set the endpoint's model_name"
            )
        return names[0] if names else ""

    async def _config(self, name: str, version: str, timeout_s: float) -> None:
        reply = await self.client.get_model_config(name, version, client_timeout=timeout_s)
        config = reply.config
        params = config.parameters
        self._digest = config_digest(config)
        self._template = (
            params["vigil_prompt_template"].string_value
            if "vigil_prompt_template" in params
            else ""
        )
        self._image_token = (
            params["vigil_image_token"].string_value if "vigil_image_token" in params else ""
        )
        self._decoupled = config.model_transaction_policy.decoupled

    async def describe(self, timeout_s: float) -> ModelIdentity:
        pinned = self._target.model_version
        try:
            name = self._target.model_name or await self._discover(timeout_s)
            if not name:
                return ModelIdentity("", pinned, ready=False)
            if not await self.client.is_model_ready(name, pinned, client_timeout=timeout_s):
                return ModelIdentity(name, pinned, ready=False)
            metadata = await self.client.get_model_metadata(name, pinned, client_timeout=timeout_s)
            version = pinned or _latest(list(metadata.versions))
            await self._config(name, pinned, timeout_s)
        except InferenceServerException as exc:
            raise _error(exc) from None
        self._name, self._version = name, version
        return ModelIdentity(name, version, ready=True, config_digest=self._digest)

    def _text(self, prompt: str, image_count: int) -> str:
        return prompt_text(self._template, self._image_token, prompt, image_count)

    async def generate(
        self,
        images: list[tuple[bytes, str]],
        prompt: str,
        request_id: str,
        timeout_s: float,
    ) -> ModelReply:
        if not self._name:
            async with self._lock:
                if not self._name:
                    identity = await self.describe(timeout_s)
                    if not identity.ready:
                        raise AdapterError("UNAVAILABLE: model is not ready", retryable=True)
        inputs = [bytes_input("text_input", [self._text(prompt, len(images)).encode("utf-8")])]
        if images:
            inputs.append(bytes_input("image", [base64.b64encode(data) for data, _ in images]))
        inputs += self._fixed_inputs
        outputs = [InferRequestedOutput("text_output")]
        try:
            if self._decoupled:
                response, text = await self._stream(inputs, outputs, request_id, timeout_s)
            else:
                result = await self.client.infer(
                    self._name,
                    inputs,
                    model_version=self._target.model_version,
                    outputs=outputs,
                    request_id=request_id,
                    client_timeout=timeout_s,
                )
                response, text = result.get_response(), _text_of(result)
            if (response.model_name, response.model_version) != (self._name, self._version):
                await self._refresh(response.model_name, response.model_version, timeout_s)
        except InferenceServerException as exc:
            raise _error(exc) from None
        return ModelReply(text, response.model_name, response.model_version, self._digest)

    async def _stream(
        self,
        inputs: list[InferInput],
        outputs: list[InferRequestedOutput],
        request_id: str,
        timeout_s: float,
    ) -> tuple[service_pb2.ModelInferResponse, str]:
        async def requests():  # type: ignore[no-untyped-def]
            yield {
                "model_name": self._name,
                "inputs": inputs,
                "model_version": self._target.model_version,
                "outputs": outputs,
                "request_id": request_id,
            }

        responses = self.client.stream_infer(requests(), stream_timeout=timeout_s)
        pieces: list[str] = []
        last: service_pb2.ModelInferResponse | None = None
        try:
            async with asyncio.timeout(timeout_s):
                async for result, error in responses:
                    if error is not None:
                        raise error
                    last = result.get_response()
                    pieces.append(_text_of(result))
                    final = last.parameters.get("triton_final_response")
                    if final is None or final.bool_param:
                        break
        except TimeoutError:
            responses.cancel()
            raise InferenceServerException(
                msg="deadline exceeded", status="StatusCode.DEADLINE_EXCEEDED"
            ) from None
        if last is None:
            raise InferenceServerException(msg="the stream closed without a response")
        responses.cancel()
        return last, "".join(pieces)

    async def _refresh(self, name: str, version: str, timeout_s: float) -> None:
        """The reply came from another model or version: describe that one's config."""
        try:
            await self._config(name, version, timeout_s)
        except InferenceServerException:
            self._digest = ""  # unknown rather than the previous model's
        self._name = name or self._name
        self._version = version

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()


def _text_of(result: object) -> str:
    values = result.as_numpy("text_output")  # type: ignore[attr-defined]
    if values is None:
        return ""
    return "".join(
        v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v)
        for v in values.reshape(-1)
    )
