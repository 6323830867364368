"""Protocol adapters: how the gateway talks to a model endpoint, behind one interface."""

from __future__ import annotations

from collections.abc import Callable

from gateway.adapters.base import (
    AdapterError,
    AdapterTarget,
    ModelAdapter,
    ModelIdentity,
    ModelReply,
)
from gateway.adapters.kserve import KServeAdapter
from gateway.adapters.openai import OpenAIAdapter
from gateway.adapters.vigil_grpc import VigilAdapter
from rpc.errors import InvalidArgument

ADAPTERS: dict[str, Callable[[AdapterTarget], ModelAdapter]] = {
    "vigil": VigilAdapter,
    "kserve_v2": KServeAdapter,
    "openai": OpenAIAdapter,
}


def create_adapter(protocol: str, target: AdapterTarget) -> ModelAdapter:
    """The adapter for ``protocol``; an unknown protocol is the caller's mistake."""
    try:
        factory = ADAPTERS[protocol]
    except KeyError:
        known = ", ".join(sorted(ADAPTERS))
        raise InvalidArgument(f"unknown protocol {protocol!r}; known: {known}") from None
    return factory(target)


__all__ = [
    "ADAPTERS",
    "AdapterError",
    "AdapterTarget",
    "ModelAdapter",
    "ModelIdentity",
    "ModelReply",
    "create_adapter",
]
