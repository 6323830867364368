"""Settings of one model server, from ``VIGIL_MODEL_*`` environment variables and CLI flags."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from model_servers.backends.base import BackendSettings
from model_servers.batching import BatchingConfig


class ModelServerSettings(BaseSettings):
    """How one model server runs. Built once in ``main()`` and passed down."""

    model_config = SettingsConfigDict(env_prefix="VIGIL_MODEL_", extra="forbid")

    backend: str = "random"
    """The backend's registry name: ``random`` (chance baseline) or ``hf`` (local HF model)."""

    model_path: Path | None = None
    """The local Hugging Face model folder; required by the ``hf`` backend."""

    model_name: str | None = None
    """Overrides the served model name (otherwise the backend's own, e.g. the folder name)."""

    host: str = "127.0.0.1"
    """The address the gRPC and metrics servers listen on."""

    port: int = Field(default=50061, ge=0, le=65535)
    """The gRPC port; 0 lets the OS choose (see ``ready_file``)."""

    metrics_port: int = Field(default=9111, ge=0, le=65535)
    """The Prometheus metrics port; 0 lets the OS choose."""

    openai_port: int | None = Field(default=None, ge=0, le=65535)
    """Also serve an OpenAI-compatible HTTP endpoint (``/v1/chat/completions``, ``/v1/models``)
    on this port; 0 lets the OS choose (see ``ready_file``); unset serves none."""

    seed: int = 0
    """Seed of the random baseline (the hf backend decodes greedily and needs none)."""

    max_new_tokens: int = Field(default=32, ge=1)
    """New-token limit for requests that do not set one."""

    torch_threads: int = Field(default=0, ge=0)
    """CPU threads for torch in the hf backend; 0 keeps torch's default (one per core). Tiny
    models on a busy machine run several times faster with 1."""

    latency_ms: float = Field(default=0.0, ge=0.0)
    """Simulated time per request of the random baseline, standing in for a real model's speed
    (tests and load checks); the hf backend ignores it."""

    max_images: int = Field(default=8, ge=0)
    """The most images one request may carry; more is INVALID_ARGUMENT."""

    max_batch_size: int = Field(default=8, ge=1)
    """Dynamic batching: the most requests one generation call takes (backends that batch, such
    as hf; others always take one at a time). 1 turns batching off."""

    max_queue_delay_ms: float = Field(default=10.0, ge=0.0)
    """Dynamic batching: how long the first request of a batch waits for others to join it."""

    max_queue_size: int = Field(default=256, ge=1)
    """The most requests waiting for the model; more is RESOURCE_EXHAUSTED (retry later)."""

    ready_file: Path | None = None
    """Where to write ``{"grpc_port": N, "metrics_port": M}`` (and ``"openai_port"`` when that
    endpoint is on) once the ports are bound."""

    def batching(self) -> BatchingConfig:
        """The dynamic-batching part of these settings."""
        return BatchingConfig(
            max_batch_size=self.max_batch_size,
            max_queue_delay_s=self.max_queue_delay_ms / 1000.0,
            max_queue_size=self.max_queue_size,
        )

    def backend_settings(self) -> BackendSettings:
        """The part of these settings a backend sees."""
        return BackendSettings(
            model_path=self.model_path,
            model_name=self.model_name,
            seed=self.seed,
            max_new_tokens=self.max_new_tokens,
            torch_threads=self.torch_threads,
            latency_ms=self.latency_ms,
        )
