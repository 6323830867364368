"""Timing the grader's full suite: every metric, every grouping, 1,000 clustered resamples.

100,000 graded rows from 250 subjects, with the axes the figures group by filled (task, format,
phrasing, plane, sequence, modality, anatomy, dataset, and format version 2's laterality and
hierarchy) and the optional columns every metric reads (``hallucinated``, ``expect_abstain``,
``is_control``). Vigil's path is ``grader.figures.compute_run_figures`` with ``final=True``: the
count tables of every group, the point value of every metric of ``METRIC_NAMES`` per group, and a
1,000-resample subject-clustered bootstrap interval of every metric for every group with enough
subjects. The comparison: ``scipy.stats.bootstrap`` computing only the overall accuracy interval,
1,000 resamples of rows (not subjects), percentile method; scipy's default BCa would add a
jackknife over all ~90,000 answered rows, so percentile is the like-for-like one.

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
from grader.figures import compute_run_figures, group_tables
from grader.metrics import METRIC_NAMES, build_count_table, compute_metrics

N_ROWS = 100_000
N_SUBJECTS = 250
N_RESAMPLES = 1000
REPEATS = 3

TASK_CLASSES = {
    "sequence": ["T1", "T1ce", "T2", "FLAIR", "PD", "MRA", "DWI"],
    "plane": ["axial", "coronal", "sagittal"],
    "is_brain": ["yes", "no"],
    "tumor_visible": ["yes", "no"],
    "laterality": ["left", "right", "bilateral", "none"],
    "abstention": ["UNSURE"],
}


def graded_rows(seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    n = N_ROWS
    subject = rng.integers(0, N_SUBJECTS, n)
    skill = rng.beta(4, 3, N_SUBJECTS)  # subject-level skill, so that the clustering is real
    tasks = np.array(list(TASK_CLASSES))
    task = rng.choice(tasks, n, p=[0.2, 0.2, 0.15, 0.2, 0.2, 0.05])
    true_class = np.empty(n, dtype=object)
    guess = np.empty(n, dtype=object)
    for name, classes in TASK_CLASSES.items():
        at = task == name
        true_class[at] = rng.choice(classes, at.sum())
        guess[at] = rng.choice(classes, at.sum())
    right = rng.random(n) < skill[subject]
    pred_class = np.where(right, true_class, guess)
    outcome = rng.choice(
        ["answered", "abstained", "unparseable", "transport_error"], n, p=[0.9, 0.04, 0.03, 0.03]
    )
    answered = outcome == "answered"
    fmt = rng.choice(["mc", "open"], n)
    expect_abstain = task == "abstention"
    return pd.DataFrame(
        {
            "subject_id": [f"sub-{s:04d}" for s in subject],
            "task": task,
            "format": fmt,
            "phrasing": rng.choice(["neutral", "clinical", "lay"], n),
            "outcome": outcome,
            "correct": np.where(expect_abstain, outcome == "abstained", answered & right),
            "confidence": np.where(rng.random(n) < 0.05, -1, rng.integers(50, 101, n)),
            "true_class": true_class,
            "pred_class": np.where(answered, pred_class, ""),
            "plane": rng.choice(["axial", "coronal", "sagittal"], n),
            "sequence": rng.choice(TASK_CLASSES["sequence"], n),
            "modality": rng.choice(["MR", "CT", "XR", "US"], n),
            "anatomy": rng.choice(["brain", "chest", "heart", "lungs", "breast"], n),
            "dataset": rng.choice([f"dataset-{i}" for i in range(8)], n),
            "laterality": rng.choice(["left", "right", "bilateral", "none", ""], n),
            "hierarchy": rng.choice(["low", "mid", "high"], n),
            "hallucinated": np.where(fmt == "open", (rng.random(n) < 0.1).astype(int), -1),
            "expect_abstain": expect_abstain,
            "is_control": expect_abstain | (rng.random(n) < 0.02),
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
def test_bench_full_suite_vs_scipy():
    rows = graded_rows()
    answered_correct = rows.loc[rows.outcome == "answered", "correct"].to_numpy(dtype=np.float64)

    def full_suite() -> pd.DataFrame:
        metrics, _ = compute_run_figures(
            rows, "bench", "model", final=True, n_resamples=N_RESAMPLES, seed=0, min_subjects=5
        )
        return metrics

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

    t_full, metrics = best_time(full_suite)
    assert isinstance(metrics, pd.DataFrame)
    t_points, _ = best_time(
        lambda: compute_run_figures(
            rows, "bench", "model", final=False, n_resamples=0, seed=0, min_subjects=5
        )
    )
    t_tables, built = best_time(lambda: group_tables(rows))
    mem_full = peak_traced_mib(full_suite)
    # The process high-water mark before scipy runs: Vigil's suite and the 100,000 rows.
    rss_vigil_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t_scipy, scipy_interval = best_time(scipy_accuracy)
    mem_scipy = peak_traced_mib(scipy_accuracy)

    # One table (all rows), the old headline path, for reference.
    plain = rows.assign(
        true_class=rows.task + ":" + rows.true_class,
        pred_class=np.where(rows.pred_class != "", rows.task + ":" + rows.pred_class, ""),
    )
    t_one_table, table = best_time(lambda: build_count_table(plain))
    t_one_boot, _ = best_time(lambda: clustered_bootstrap(table, N_RESAMPLES, seed=0))
    t_one_bca, _ = best_time(lambda: clustered_bootstrap(table, N_RESAMPLES, 0, method="bca"))
    t_point, _ = best_time(lambda: compute_metrics(table.totals(), table.layout))
    maxrss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    n_groups = metrics.groupby(["task", "format", "group_axis", "group_value"]).ngroups
    with_interval = int(metrics.has_interval.sum())
    print()
    print(f"rows {len(rows):,}, subjects {N_SUBJECTS}, metrics {len(METRIC_NAMES)}, "
          f"groups {n_groups}, resamples {N_RESAMPLES}")  # fmt: skip
    print(f"metric values {len(metrics):,}, with an interval {with_interval:,}")
    print(f"full suite (compute_run_figures, final)     {t_full * 1e3:9.1f} ms, "
          f"peak traced {mem_full:7.1f} MiB")  # fmt: skip
    print(f"  of which count tables of all groups       {t_tables * 1e3:9.1f} ms "
          f"({len(built.groups)} tables)")  # fmt: skip
    print(f"  of which tables + point figures (no boot) {t_points * 1e3:9.1f} ms")
    print(f"  so the bootstrap of every metric x group  {(t_full - t_points) * 1e3:9.1f} ms")
    print(f"scipy.stats.bootstrap, accuracy only, rows  {t_scipy * 1e3:9.1f} ms, "
          f"peak traced {mem_scipy:7.1f} MiB")  # fmt: skip
    print(f"ratio full suite / scipy accuracy-only: {t_full / t_scipy:.2f}x (best of {REPEATS})")
    print(f"one table (all rows): build {t_one_table * 1e3:.1f} ms, point {t_point * 1e3:.2f} ms, "
          f"percentile x{N_RESAMPLES} {t_one_boot * 1e3:.1f} ms, "
          f"BCa x{N_RESAMPLES} {t_one_bca * 1e3:.1f} ms")  # fmt: skip
    print(f"process max RSS {rss_vigil_mib:.0f} MiB before scipy ran, {maxrss_mib:.0f} MiB after")
    top = metrics[(metrics.task == "all") & (metrics.format == "all") & (metrics.group_axis == "")]
    acc = top[top.metric == "accuracy"].iloc[0]
    print(f"accuracy 95% interval: clustered ({acc.lower:.4f}, {acc.upper:.4f}), "
          f"rows ({scipy_interval[0]:.4f}, {scipy_interval[1]:.4f})")  # fmt: skip

    assert set(top.metric) == set(METRIC_NAMES)
    assert acc.lower < acc.upper
    # Subject-level skill makes the clustered interval the wider one.
    assert acc.upper - acc.lower > scipy_interval[1] - scipy_interval[0]
