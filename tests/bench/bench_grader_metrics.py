"""Timing the grader's metrics: count table + all metrics + clustered bootstrap vs scipy.

100,000 graded rows from 250 subjects. Vigil's path: ``build_count_table``, ``compute_metrics`` for
the point estimates, then a 1,000-resample subject-clustered bootstrap of every metric (one
matrix product). The comparison: ``scipy.stats.bootstrap`` for the accuracy interval alone,
1,000 resamples, resampling rows (not subjects), percentile method. scipy's default BCa would add
a jackknife over all ~90,000 answered rows (quadratic), so percentile is the like-for-like one.

Run: ``.venv/bin/pytest tests/bench/bench_grader_metrics.py -q -s -m bench``.
"""

from __future__ import annotations

import resource
import time
import tracemalloc
from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest
import scipy.stats

from grader.bootstrap import clustered_bootstrap
from grader.metrics import METRIC_NAMES, build_count_table, compute_metrics

N_ROWS = 100_000
N_SUBJECTS = 250
N_RESAMPLES = 1000
REPEATS = 5


def graded_rows(seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    classes = np.array(["T1", "T1ce", "T2", "FLAIR", "PD", "MRA", "DWI"])
    outcome = rng.choice(
        ["answered", "abstained", "unparseable", "transport_error"],
        N_ROWS,
        p=[0.9, 0.04, 0.03, 0.03],
    )
    # Subject-level skill, so that the clustering is real.
    skill = rng.beta(4, 3, N_SUBJECTS)
    subject = rng.integers(0, N_SUBJECTS, N_ROWS)
    true_class = rng.choice(classes, N_ROWS)
    right = rng.random(N_ROWS) < skill[subject]
    pred_class = np.where(right, true_class, rng.choice(classes, N_ROWS))
    answered = outcome == "answered"
    confidence = np.where(rng.random(N_ROWS) < 0.05, -1, rng.integers(50, 101, N_ROWS))
    return pd.DataFrame(
        {
            "subject_id": [f"sub-{s:04d}" for s in subject],
            "outcome": outcome,
            "correct": answered & (pred_class == true_class),
            "confidence": confidence,
            "true_class": true_class,
            "pred_class": np.where(answered, pred_class, ""),
        }
    )


def best_time(fn: Callable[[], object], repeats: int = REPEATS) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def peak_traced_mib(fn: Callable[[], object]) -> float:
    """Peak Python + numpy allocation during ``fn`` (numpy reports to tracemalloc)."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


@pytest.mark.bench
def test_bench_count_table_bootstrap_vs_scipy():
    rows = graded_rows()
    answered_correct = rows.loc[rows.outcome == "answered", "correct"].to_numpy(dtype=np.float64)

    def vigil() -> dict[str, tuple[float, float]]:
        table = build_count_table(rows)
        compute_metrics(table.totals(), table.layout)
        return clustered_bootstrap(table, n_resamples=N_RESAMPLES, seed=0)

    def scipy_accuracy() -> tuple[float, float]:
        result = scipy.stats.bootstrap(
            (answered_correct,),
            np.mean,
            n_resamples=N_RESAMPLES,
            vectorized=True,
            method="percentile",
            rng=np.random.default_rng(0),
        )
        return result.confidence_interval.low, result.confidence_interval.high

    t_build, table = best_time(lambda: build_count_table(rows))
    t_point, _ = best_time(lambda: compute_metrics(table.totals(), table.layout))
    t_boot, _ = best_time(lambda: clustered_bootstrap(table, n_resamples=N_RESAMPLES, seed=0))
    t_vigil, intervals = best_time(vigil)
    t_scipy, scipy_interval = best_time(scipy_accuracy)
    mem_vigil = peak_traced_mib(vigil)
    mem_scipy = peak_traced_mib(scipy_accuracy)
    maxrss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    print()
    print(f"rows {len(rows):,}, subjects {table.n_subjects}, answered {len(answered_correct):,}")
    print(f"count table {table.counts.shape}, {table.counts.nbytes / 2**20:.2f} MiB")
    print(f"build_count_table                 {t_build * 1e3:9.1f} ms")
    print(f"compute_metrics (point, all)      {t_point * 1e3:9.3f} ms")
    print(f"clustered bootstrap x{N_RESAMPLES} (all)  {t_boot * 1e3:9.1f} ms")
    print(
        f"vigil total: table + point + bootstrap of {len(METRIC_NAMES)} metrics "
        f"{t_vigil * 1e3:9.1f} ms, peak traced {mem_vigil:7.1f} MiB"
    )
    print(
        f"scipy.stats.bootstrap accuracy only, x{N_RESAMPLES} rows "
        f"{t_scipy * 1e3:9.1f} ms, peak traced {mem_scipy:7.1f} MiB"
    )
    print(f"ratio scipy / vigil: {t_scipy / t_vigil:.1f}x (best of {REPEATS} each)")
    print(f"process max RSS {maxrss_mib:.0f} MiB")
    print(f"accuracy 95% interval: clustered {intervals['accuracy']}, rows {scipy_interval}")

    lower, upper = intervals["accuracy"]
    assert lower < upper
    # Subject-level skill makes the clustered interval the wider one.
    assert upper - lower > scipy_interval[1] - scipy_interval[0]
