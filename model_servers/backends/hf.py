"""Any local Hugging Face image-text-to-text model, decoded greedily on CPU.

``torch`` and ``transformers`` are imported inside the methods, so importing this module (and the
registry that names it) costs nothing for services that never load a model.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any

from model_servers.backends.base import (
    BackendLoadError,
    BackendSettings,
    FinishReason,
    GenerationInput,
    GenerationOutput,
    ModelInfo,
)
from model_servers.images import decode_image

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
_HASH_CHUNK = 1 << 20


def model_version(path: Path) -> str:
    """The first 12 hex digits of a SHA-256 over ``config.json`` and the weight files, by name."""
    digest = hashlib.sha256()
    files = [path / "config.json"] + sorted(
        p for p in path.iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES)
    )
    for file in files:
        digest.update(file.name.encode("utf-8") + b"\0")
        with file.open("rb") as fh:
            while chunk := fh.read(_HASH_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()[:12]


def model_name_of(path: Path, override: str | None) -> str:
    """The override, else the ``_name_or_path`` saved in ``config.json``, else the folder name."""
    if override:
        return override
    try:
        saved = json.loads((path / "config.json").read_text()).get("_name_or_path")
    except (OSError, ValueError):
        saved = None
    return saved if isinstance(saved, str) and saved else path.resolve().name


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class HFBackend:
    """A ``transformers`` image-text-to-text model from a local folder."""

    name = "hf"

    def __init__(self, settings: BackendSettings) -> None:
        if settings.model_path is None:
            raise BackendLoadError("the hf backend needs a model path (--model-path)")
        self._path = Path(settings.model_path)
        self._name_override = settings.model_name
        self._torch_threads = settings.torch_threads
        self._lock = threading.Lock()
        self._model: Any = None
        self._processor: Any = None
        self._info: ModelInfo | None = None

    def load(self) -> None:
        path = self._path
        if not path.is_dir():
            raise BackendLoadError(f"model path {path} does not exist or is not a folder")
        if not (path / "config.json").is_file():
            raise BackendLoadError(
                f"model path {path} holds no Hugging Face model (no config.json)"
            )
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            import torch

            if self._torch_threads > 0:
                torch.set_num_threads(self._torch_threads)
            from transformers import AutoModelForImageTextToText, AutoProcessor
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
            model = AutoModelForImageTextToText.from_pretrained(path, local_files_only=True)
            processor = AutoProcessor.from_pretrained(path, local_files_only=True)
            version = model_version(path)
        except Exception as exc:  # noqa: BLE001 - any load failure becomes one clear line
            raise BackendLoadError(f"cannot load model from {path}: {_one_line(exc)}") from exc
        model.eval()
        self._model = model
        self._processor = processor
        self._info = ModelInfo(
            model_name=model_name_of(path, self._name_override),
            model_version=version,
            backend=self.name,
            supports_logprobs=True,
        )

    def describe(self) -> ModelInfo:
        if self._info is None:
            raise RuntimeError("describe() before load()")
        return self._info

    def _prompt_text(self, prompt: str, image_count: int) -> tuple[str, bool]:
        """The model's input text and whether it already holds the special tokens it needs."""
        processor = self._processor
        if getattr(processor, "chat_template", None):
            content: list[dict[str, str]] = [{"type": "image"} for _ in range(image_count)]
            content.append({"type": "text", "text": prompt})
            messages = [{"role": "user", "content": content}]
            text = processor.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False
            )
            return text, True
        token = getattr(processor, "image_token", None) or "<image>"
        return f"{token}\n" * image_count + prompt, False

    def generate(self, request: GenerationInput) -> GenerationOutput:
        return self.generate_batch([request])[0]

    def generate_batch(self, requests: list[GenerationInput]) -> list[GenerationOutput]:
        """Greedy generation for several requests in one padded batch.

        Prompts are left-padded with an attention mask, so every row's new tokens start at the
        same position; each row is cut at its first end-of-sequence token and at its own
        ``max_new_tokens``. Greedy decoding makes a row's text the same as it would be alone
        (up to float rounding in the padded matrix products).
        """
        import torch

        if not requests:
            return []
        images = [
            [decode_image(data, i).convert("RGB") for i, data in enumerate(request.images)]
            for request in requests
        ]
        with self._lock:
            model, processor = self._model, self._processor
            if model is None:
                raise RuntimeError("generate() before load()")
            texts: list[str] = []
            templated = False
            for request, row_images in zip(requests, images, strict=True):
                text, templated = self._prompt_text(request.prompt, len(row_images))
                texts.append(text)
            flat_images = [image for row in images for image in row]
            kwargs: dict[str, Any] = {"text": texts, "return_tensors": "pt", "padding": True}
            if templated:
                kwargs["add_special_tokens"] = False
            if flat_images:
                kwargs["images"] = flat_images
            tokenizer = processor.tokenizer
            tokenizer.padding_side = "left"
            inputs = processor(**kwargs)
            padded_len = int(inputs["input_ids"].shape[1])
            prompt_lens = inputs["attention_mask"].sum(dim=1).tolist()
            pad_id = tokenizer.pad_token_id
            if pad_id is None:
                pad_id = tokenizer.eos_token_id
            want_logprobs = any(r.return_logprobs for r in requests)
            with torch.inference_mode():
                out = model.generate(
                    **inputs,
                    max_new_tokens=max(r.max_new_tokens for r in requests),
                    do_sample=False,
                    return_dict_in_generate=True,
                    output_scores=want_logprobs,
                    output_logits=want_logprobs,
                    pad_token_id=pad_id,
                )
            encoder_decoder = bool(getattr(model.config, "is_encoder_decoder", False))
            eos_ids = _eos_ids(model.generation_config, tokenizer)
            steps = None
            if want_logprobs:
                steps = out.logits if getattr(out, "logits", None) else out.scores
            outputs = []
            for row, request in enumerate(requests):
                sequence = out.sequences[row]
                # An encoder-decoder model's output starts with the decoder start token.
                new_ids = sequence[1:] if encoder_decoder else sequence[padded_len:]
                outputs.append(
                    _row_output(
                        new_ids.tolist()[: request.max_new_tokens],
                        request,
                        int(prompt_lens[row]),
                        eos_ids,
                        tokenizer,
                        [step[row] for step in steps] if steps is not None else None,
                    )
                )
            return outputs


def _row_output(
    new_ids: list[int],
    request: GenerationInput,
    prompt_len: int,
    eos_ids: set[int],
    tokenizer: Any,
    step_logits: list[Any] | None,
) -> GenerationOutput:
    """One row of a batch: cut at the first end-of-sequence token, with its log-probabilities."""
    import torch

    finish: FinishReason = "length"
    for i, token_id in enumerate(new_ids):
        if token_id in eos_ids:
            new_ids = new_ids[: i + 1]
            finish = "stop"
            break
    else:
        if len(new_ids) < request.max_new_tokens:
            finish = "stop"  # a stop string or another criterion, not the limit
    logprobs: list[tuple[str, float]] = []
    if request.return_logprobs and step_logits is not None:
        for logits, token_id in zip(step_logits, new_ids, strict=False):
            value = torch.log_softmax(logits.float(), dim=-1)[token_id].item()
            logprobs.append((tokenizer.decode([token_id]), float(value)))
    return GenerationOutput(
        text=tokenizer.decode(new_ids, skip_special_tokens=True),
        prompt_token_count=prompt_len,
        completion_token_count=len(new_ids),
        finish_reason=finish,
        logprobs=logprobs,
    )


def _eos_ids(generation_config: Any, tokenizer: Any) -> set[int]:
    value = getattr(generation_config, "eos_token_id", None)
    if value is None:
        value = tokenizer.eos_token_id
    if value is None:
        return set()
    return {int(v) for v in value} if isinstance(value, (list, tuple)) else {int(value)}
