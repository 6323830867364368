"""The interface every protocol adapter implements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class AdapterTarget:
    """Where an adapter sends requests: the server, and the model on it when it serves several."""

    address: str
    model_name: str = ""
    model_version: str = ""


@dataclass(frozen=True)
class ModelIdentity:
    """What the endpoint says it serves."""

    model_name: str
    model_version: str
    ready: bool
    config_digest: str = ""


@dataclass(frozen=True)
class ModelReply:
    """One generation as the endpoint returned it."""

    text: str
    model_name: str
    model_version: str
    config_digest: str = ""
    # (token, natural-log probability) per generated token, when the endpoint offers them.
    logprobs: tuple[tuple[str, float], ...] = ()


class AdapterError(Exception):
    """A failed call: ``timeout`` tells a deadline apart from other transport errors."""

    def __init__(self, message: str, *, timeout: bool = False, retryable: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.timeout = timeout
        self.retryable = retryable


class ModelAdapter(Protocol):
    """Talks to one endpoint. Implementations raise ``AdapterError`` for every failed call."""

    protocol: str

    async def describe(self, timeout_s: float) -> ModelIdentity: ...

    async def generate(
        self,
        images: list[tuple[bytes, str]],
        prompt: str,
        request_id: str,
        timeout_s: float,
    ) -> ModelReply: ...

    async def close(self) -> None: ...
