"""Fixtures shared by the integration and end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.stack import Stack


@pytest.fixture(scope="session")
def benchmark_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("benchmarks")


@pytest.fixture(scope="session")
def small_benchmark(benchmark_root: Path):
    """The built-in brain-MRI suite, small size, built once per test session."""
    from benchmark.store import ensure_builtin

    return ensure_builtin(benchmark_root, "brain-mri", "small", seed=0, progress=False)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny LLaVA-architecture model with random weights, built locally once per session."""
    from model_servers.tiny import ensure_tiny_llava

    return ensure_tiny_llava(tmp_path_factory.mktemp("models") / "tiny-llava")


@pytest.fixture
def stack(tmp_path: Path, benchmark_root: Path) -> Iterator[Stack]:
    s = Stack(tmp_path / "stack", benchmark_root)
    try:
        yield s
    finally:
        s.close()
