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
        import torch

        images = [decode_image(data, i).convert("RGB") for i, data in enumerate(request.images)]
        with self._lock:
            model, processor = self._model, self._processor
            if model is None:
                raise RuntimeError("generate() before load()")
            text, templated = self._prompt_text(request.prompt, len(images))
            kwargs: dict[str, Any] = {"text": text, "return_tensors": "pt"}
            if templated:
                kwargs["add_special_tokens"] = False
            if images:
                kwargs["images"] = images
            inputs = processor(**kwargs)
            prompt_len = int(inputs["input_ids"].shape[1])
            tokenizer = processor.tokenizer
            pad_id = tokenizer.pad_token_id
            if pad_id is None:
                pad_id = tokenizer.eos_token_id
            with torch.inference_mode():
                out = model.generate(
                    **inputs,
                    max_new_tokens=request.max_new_tokens,
                    do_sample=False,
                    return_dict_in_generate=True,
                    output_scores=request.return_logprobs,
                    output_logits=request.return_logprobs,
                    pad_token_id=pad_id,
                )
            sequence = out.sequences[0]
            if getattr(model.config, "is_encoder_decoder", False):
                new_ids = sequence[1:].tolist()  # drop the decoder start token
            else:
                new_ids = sequence[prompt_len:].tolist()
            eos_ids = _eos_ids(model.generation_config, tokenizer)
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
            if request.return_logprobs:
                steps = out.logits if getattr(out, "logits", None) else out.scores
                for step, token_id in zip(steps, new_ids, strict=False):
                    value = torch.log_softmax(step[0].float(), dim=-1)[token_id].item()
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
