"""Subject-clustered bootstrap intervals for every metric, as one matrix product.

Slices and prompts of one subject are correlated, so resampling rows would make intervals too
narrow; the audit resamples whole subjects (DESIGN.md, seed 001). Resample b draws S subjects
with replacement; ``W[b, s]`` counts how often subject s was drawn, so each row of ``W`` is a
Multinomial(S, 1/S) sample, and the resampled feature sums are ``W @ counts`` for all resamples
at once. Metrics are then computed for the whole batch (``compute_metrics``) and each interval is
the percentile interval of the resampled values (``method="percentile"``, the default).

``method="bca"`` gives bias-corrected and accelerated intervals (Efron 1987; Efron and
Tibshirani 1993, ch. 14) with the clustering kept: the bias correction ``z0`` is the normal
quantile of the share of resamples below the point estimate (ties count one half, as in
``scipy.stats.bootstrap``), and the acceleration comes from a leave-one-subject-out jackknife,
which is again one batch: ``totals - counts[s]`` for every subject s. Where BCa is undefined
the interval falls back to the percentile one: fewer than ``MIN_SUBJECTS`` subjects, every
resample equal, the point estimate outside the resamples (infinite ``z0``), a jackknife without
spread or with undefined values (infinite or NaN acceleration).

Determinism: the draws come from ``numpy.random.default_rng(seed)``; the counts are integers held
exactly in float64, so ``W @ counts`` is exact whatever the summation order, and the same table
and seed give bit-identical intervals.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
from scipy.special import ndtr, ndtri

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


def jackknife_metrics(table: CountTable) -> dict[str, np.ndarray]:
    """Each metric with one subject left out at a time: name -> (S,) array."""
    return compute_metrics(table.totals()[None, :] - table.counts, table.layout)


def bca_interval(
    values: np.ndarray, point: float, jackknife: np.ndarray, level: float = 0.95
) -> tuple[tuple[float, float], bool]:
    """(the BCa interval, True) or, where BCa is undefined, (the percentile interval, False)."""
    values = np.asarray(values, dtype=np.float64)
    jackknife = np.asarray(jackknife, dtype=np.float64)
    fallback = (percentile_interval(values, level), False)
    finite = values[~np.isnan(values)]
    if (
        jackknife.size < MIN_SUBJECTS
        or not np.isfinite(point)
        or np.any(~np.isfinite(jackknife))
        or finite.size == 0
        or 2 * finite.size < values.size
        or np.all(finite == finite[0])
    ):
        return fallback
    below = (np.count_nonzero(finite < point) + np.count_nonzero(finite <= point)) / 2.0
    z0 = float(ndtri(below / finite.size))
    spread = jackknife.mean() - jackknife
    denominator = 6.0 * float(np.sum(spread**2)) ** 1.5
    if not np.isfinite(z0) or denominator <= 0.0:
        return fallback
    acceleration = float(np.sum(spread**3)) / denominator
    z_tail = float(ndtri((1.0 - level) / 2.0))
    tails = []
    for z in (z_tail, -z_tail):
        shifted = z0 + z
        tails.append(float(ndtr(z0 + shifted / (1.0 - acceleration * shifted))))
    if not all(np.isfinite(tails)) or not 0.0 <= tails[0] <= tails[1] <= 1.0:
        return fallback
    lower, upper = np.percentile(finite, [100.0 * tails[0], 100.0 * tails[1]])
    return (float(lower), float(upper)), True


def clustered_bootstrap(
    table: CountTable,
    n_resamples: int = 1000,
    seed: int | Sequence[int] = 0,
    level: float = 0.95,
    method: Literal["percentile", "bca"] = "percentile",
) -> dict[str, tuple[float, float]]:
    """Intervals at ``level`` for every metric, resampling whole subjects.

    ``method`` is "percentile" (the default) or "bca" (which falls back to percentile per metric
    where BCa is undefined; ``bca_interval`` says which was used). Computes intervals whatever
    the number of subjects; check ``interval_allowed`` before showing them. A table without
    subjects gives NaN intervals.
    """
    if not 0.0 < level < 1.0:
        raise ValueError("level must be between 0 and 1")
    if method not in ("percentile", "bca"):
        raise ValueError(f"method must be 'percentile' or 'bca', not {method!r}")
    resampled = resampled_metrics(table, n_resamples, seed)
    if method == "percentile" or table.n_subjects < MIN_SUBJECTS:
        return {name: percentile_interval(resampled[name], level) for name in METRIC_NAMES}
    point = compute_metrics(table.totals(), table.layout)
    jackknife = jackknife_metrics(table)
    return {
        name: bca_interval(resampled[name], float(point[name]), jackknife[name], level)[0]
        for name in METRIC_NAMES
    }
