"""Built-in benchmark suites, registered by name.

A suite builder takes (size, seed, progress) and returns the manifest DataFrame and the images
keyed by their relative path; :func:`benchmark.store.write_benchmark` validates and stores them.
Builders are imported only when used, so importing the store stays cheap.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import pandas as pd

from benchmark.errors import BenchmarkInvalid, BenchmarkNotFound

Builder = Callable[..., tuple[pd.DataFrame, dict[str, bytes]]]

SUITES: dict[str, str] = {
    "brain-mri": "benchmark.suites.brain_mri",
    "cube": "benchmark.suites.cube",
}
"""Suite name -> module providing ``SIZES`` and ``build(size, seed, progress)``."""


def _module(suite: str):
    try:
        return importlib.import_module(SUITES[suite])
    except KeyError:
        known = ", ".join(sorted(SUITES))
        raise BenchmarkNotFound(f"unknown suite {suite!r}; known suites: {known}") from None


def suite_sizes(suite: str) -> tuple[str, ...]:
    """The sizes a suite can be built at."""
    return tuple(_module(suite).SIZES)


def build_suite(
    suite: str, size: str, seed: int = 0, progress: bool = True
) -> tuple[pd.DataFrame, dict[str, bytes]]:
    """Build a suite's manifest and images in memory (nothing is written)."""
    module = _module(suite)
    if size not in module.SIZES:
        raise BenchmarkInvalid(
            f"{suite}-{size}", [f"unknown size {size!r}; choose from {', '.join(module.SIZES)}"]
        )
    builder: Builder = module.build
    return builder(size, seed, progress=progress)
