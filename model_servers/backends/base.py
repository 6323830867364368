"""The backend contract: a Protocol every model backend implements, and its domain types.

A backend knows nothing of gRPC or protobuf. The data plane (``model_servers.runtime``) calls
``load`` once, in a worker thread, then ``generate`` for each request, also in a worker thread.
A backend that can run several requests at once also implements ``generate_batch``
(:class:`BatchBackend`); the data plane then hands it dynamic batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class BackendSettings:
    """What a backend needs from the server's settings, free of the settings library."""

    model_path: Path | None = None
    model_name: str | None = None
    seed: int = 0
    max_new_tokens: int = 32
    torch_threads: int = 0
    latency_ms: float = 0.0


@dataclass(frozen=True)
class ModelInfo:
    """Which model a backend serves."""

    model_name: str
    model_version: str
    backend: str
    supports_logprobs: bool


@dataclass(frozen=True)
class GenerationInput:
    """One request: encoded images (already checked to decode), a prompt, and decoding limits."""

    images: list[bytes]
    media_types: list[str]
    prompt: str
    max_new_tokens: int
    return_logprobs: bool = False
    request_id: str = ""


@dataclass(frozen=True)
class GenerationOutput:
    """One generation: the new text only, with its token accounting."""

    text: str
    prompt_token_count: int
    completion_token_count: int
    finish_reason: FinishReason
    logprobs: list[tuple[str, float]] = field(default_factory=list)


@runtime_checkable
class Backend(Protocol):
    """A model behind Vigil's ``ModelService``."""

    name: str

    def load(self) -> None:
        """Load the model; blocking and possibly slow. Raises on a model that cannot load."""
        ...

    def describe(self) -> ModelInfo:
        """Name, version and capabilities of the served model; valid after ``load``."""
        ...

    def generate(self, request: GenerationInput) -> GenerationOutput:
        """Answer one request; blocking. Raises ``rpc.errors.VigilError`` for bad input."""
        ...


@runtime_checkable
class BatchBackend(Backend, Protocol):
    """A backend that answers several requests in one call (dynamic batching)."""

    def generate_batch(self, requests: list[GenerationInput]) -> list[GenerationOutput]:
        """Answer ``requests`` together; one output per request, in order, each the same as
        ``generate`` would give for that request alone. Blocking."""
        ...


class BackendLoadError(Exception):
    """A model that cannot load: a missing path, a folder that holds no model, broken weights.

    The message is one line that names the path; the server prints it and exits non-zero.
    """
