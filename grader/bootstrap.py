"""Subject-clustered bootstrap intervals for every metric, as one matrix product.

Slices and prompts of one subject are correlated, so resampling rows would make intervals too
narrow; the audit resamples whole subjects (DESIGN.md, seed 001). Resample b draws S subjects
with replacement; ``W[b, s]`` counts how often subject s was drawn, so each row of ``W`` is a
Multinomial(S, 1/S) sample, and the resampled feature sums are ``W @ counts`` for all resamples
at once. Metrics are then computed for the whole batch (``compute_metrics``) and each interval is
the percentile interval of the resampled values.

Determinism: the draws come from ``numpy.random.default_rng(seed)``; the counts are integers held
exactly in float64, so ``W @ counts`` is exact whatever the summation order, and the same table
and seed give bit-identical intervals.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from grader.metrics import METRIC_NAMES, CountTable, compute_metrics

MIN_SUBJECTS = 5  # below this many subjects, callers suppress intervals (and say so)
NAN_INTERVAL = (float("nan"), float("nan"))


def interval_allowed(table: CountTable) -> bool:
    """Whether ``table`` has enough subjects for a bootstrap interval to be shown."""
    return table.n_subjects >= MIN_SUBJECTS


def subject_weights(n_subjects: int, n_resamples: int, rng: np.random.Generator) -> np.ndarray:
    """(n_resamples, n_subjects) draw counts: each row is S subjects drawn with replacement."""
    draws = rng.integers(0, n_subjects, size=(n_resamples, n_subjects))
    offsets = np.arange(n_resamples, dtype=np.int64)[:, None] * n_subjects
    flat = np.bincount((draws + offsets).ravel(), minlength=n_resamples * n_subjects)
    return flat.reshape(n_resamples, n_subjects).astype(np.float64)


def resampled_metrics(
    table: CountTable, n_resamples: int = 1000, seed: int | Sequence[int] = 0
) -> dict[str, np.ndarray]:
    """Each metric over ``n_resamples`` subject-clustered resamples: name -> (B,) array."""
    if n_resamples < 1:
        raise ValueError("n_resamples must be at least 1")
    if table.n_subjects == 0:
        return {name: np.full(n_resamples, np.nan) for name in METRIC_NAMES}
    rng = np.random.default_rng(seed)
    weights = subject_weights(table.n_subjects, n_resamples, rng)
    return compute_metrics(weights @ table.counts, table.layout)


def percentile_interval(values: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """The central ``level`` percentile interval of ``values``, ignoring NaNs.

    NaN when more than half of the values are NaN (the metric is undefined in most resamples).
    """
    values = np.asarray(values, dtype=np.float64)
    finite = values[~np.isnan(values)]
    if finite.size == 0 or 2 * finite.size < values.size:
        return NAN_INTERVAL
    tail = round(50.0 * (1.0 - level), 10)  # 2.5 for 0.95, not 2.5000000000000022
    lower, upper = np.percentile(finite, [tail, 100.0 - tail])
    return float(lower), float(upper)


def clustered_bootstrap(
    table: CountTable,
    n_resamples: int = 1000,
    seed: int | Sequence[int] = 0,
    level: float = 0.95,
) -> dict[str, tuple[float, float]]:
    """Percentile intervals at ``level`` for every metric, resampling whole subjects.

    Computes intervals whatever the number of subjects; check ``interval_allowed`` before showing
    them. A table without subjects gives NaN intervals.
    """
    if not 0.0 < level < 1.0:
        raise ValueError("level must be between 0 and 1")
    resampled = resampled_metrics(table, n_resamples, seed)
    return {name: percentile_interval(resampled[name], level) for name in METRIC_NAMES}
