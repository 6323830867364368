"""Model backends behind one Protocol, registered by name.

``random`` is the chance baseline; ``hf`` serves a local Hugging Face image-text-to-text model.
Neither import pulls in ``torch``: the ``hf`` backend imports it when it loads.
"""

from __future__ import annotations

from collections.abc import Callable

from model_servers.backends.base import (
    Backend,
    BackendLoadError,
    BackendSettings,
    GenerationInput,
    GenerationOutput,
    ModelInfo,
)
from model_servers.backends.baseline import RandomBackend
from model_servers.backends.hf import HFBackend

BACKENDS: dict[str, Callable[[BackendSettings], Backend]] = {
    "random": RandomBackend,
    "hf": HFBackend,
}


class UnknownBackend(ValueError):
    """A backend name that is not in ``BACKENDS``."""


def create_backend(name: str, settings: BackendSettings) -> Backend:
    """Build the backend registered as ``name``; an unknown name lists the known ones."""
    try:
        factory = BACKENDS[name]
    except KeyError:
        known = ", ".join(sorted(BACKENDS))
        raise UnknownBackend(f"unknown backend {name!r}; known backends: {known}") from None
    return factory(settings)


__all__ = [
    "BACKENDS",
    "Backend",
    "BackendLoadError",
    "BackendSettings",
    "GenerationInput",
    "GenerationOutput",
    "ModelInfo",
    "UnknownBackend",
    "create_backend",
]
