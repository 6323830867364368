"""The subject-clustered bootstrap: determinism, clustering, and a naive loop for comparison."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from grader.bootstrap import (
    MIN_SUBJECTS,
    clustered_bootstrap,
    interval_allowed,
    percentile_interval,
    resampled_metrics,
    subject_weights,
)
from grader.metrics import METRIC_NAMES, build_count_table, point_metrics
from tests.unit.test_metrics import COLUMNS, random_rows


def rows_with_correctness(correct_by_subject: list[list[bool]]) -> pd.DataFrame:
    rows = [
        (f"s{s:02d}", "answered", ok, 90 if i % 2 else 40, "yes" if i % 3 else "no", "yes")
        for s, flags in enumerate(correct_by_subject)
        for i, ok in enumerate(flags)
    ]
    return pd.DataFrame(rows, columns=COLUMNS)


def same(a: dict, b: dict) -> bool:
    """Bit-identical intervals, NaN equal to NaN."""
    return a.keys() == b.keys() and all(
        np.array_equal(np.array(a[k]), np.array(b[k]), equal_nan=True) for k in a
    )


def test_deterministic_for_a_seed():
    table = build_count_table(random_rows(0))
    first = clustered_bootstrap(table, n_resamples=300, seed=7)
    assert same(first, clustered_bootstrap(table, n_resamples=300, seed=7))
    assert not same(first, clustered_bootstrap(table, n_resamples=300, seed=8))
    by_sequence = clustered_bootstrap(table, n_resamples=300, seed=[7, 1, 2])
    assert same(by_sequence, clustered_bootstrap(table, n_resamples=300, seed=[7, 1, 2]))
    assert set(first) == set(METRIC_NAMES)


def test_weights_are_subject_draw_counts():
    weights = subject_weights(12, 500, np.random.default_rng(0))
    assert weights.shape == (500, 12)
    assert np.all(weights.sum(axis=1) == 12)
    assert np.all(weights == np.round(weights)) and weights.min() >= 0
    assert weights.mean() == pytest.approx(1.0, abs=0.05)


def test_point_estimate_inside_interval_for_a_big_sample():
    table = build_count_table(random_rows(1, n=20000, n_subjects=200))
    intervals = clustered_bootstrap(table, n_resamples=1000, seed=0)
    point = point_metrics(table)
    # The resolution of an uninformative forecast sits near 0 and resampling biases it upwards:
    # its percentile interval can lie above the point (what BCa corrects, and where BCa falls
    # back when the point is below every resample). Undefined metrics (no such rows) are NaN.
    biased = {"brier_resolution"}
    for name in METRIC_NAMES:
        if name in biased or math.isnan(point[name]):
            continue
        lower, upper = intervals[name]
        assert lower <= point[name] <= upper, (name, lower, point[name], upper)
        assert upper - lower < 0.1, name


def test_resampling_whole_subjects_widens_clustered_intervals():
    n_subjects, per_subject = 40, 50
    # Same 1000 correct and 1000 wrong answers, arranged two ways.
    clustered = [[s % 2 == 0] * per_subject for s in range(n_subjects)]
    spread = [[i % 2 == 0 for i in range(per_subject)] for _ in range(n_subjects)]
    wide = clustered_bootstrap(build_count_table(rows_with_correctness(clustered)), seed=3)
    narrow = clustered_bootstrap(build_count_table(rows_with_correctness(spread)), seed=3)
    wide_width = wide["accuracy"][1] - wide["accuracy"][0]
    narrow_width = narrow["accuracy"][1] - narrow["accuracy"][0]
    # Clustered: accuracy is the share of "good" subjects drawn, sd ~ sqrt(.25 / 40) ~ .08.
    assert 0.2 < wide_width < 0.45
    # Spread: every subject is exactly half right, so every resample gives exactly 0.5.
    assert narrow_width == 0.0
    assert narrow["accuracy"] == (0.5, 0.5)


def naive_clustered_accuracy(rows: pd.DataFrame, n_resamples: int, seed: int) -> np.ndarray:
    """The textbook cluster bootstrap, one resample at a time over the rows themselves."""
    subjects = sorted(rows.subject_id.unique())
    by_subject = {s: rows[rows.subject_id == s] for s in subjects}
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(subjects), size=(n_resamples, len(subjects)))
    values = []
    for drawn in draws:
        resample = pd.concat([by_subject[subjects[i]] for i in drawn])
        answered = resample[resample.outcome == "answered"]
        n_correct = int(answered.correct.sum())
        values.append(n_correct / len(answered) if len(answered) else math.nan)
    return np.array(values)


def test_matrix_product_equals_naive_loop():
    rows = random_rows(2, n=1500, n_subjects=25)
    table = build_count_table(rows)
    naive = naive_clustered_accuracy(rows, n_resamples=200, seed=11)
    fast = resampled_metrics(table, n_resamples=200, seed=11)["accuracy"]
    np.testing.assert_array_equal(fast, naive)
    assert clustered_bootstrap(table, n_resamples=200, seed=11)["accuracy"] == (
        percentile_interval(naive)
    )
    lower, upper = np.percentile(naive, [2.5, 97.5])
    assert percentile_interval(naive) == (lower, upper)


def test_percentile_interval_nan_rule():
    six_nan = np.array([math.nan] * 6 + [1.0, 2.0, 3.0, 4.0])
    four_nan = np.array([math.nan] * 4 + [1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    assert all(math.isnan(v) for v in percentile_interval(six_nan))
    assert percentile_interval(four_nan) == tuple(np.percentile([1.0, 2, 3, 4, 5, 6], [2.5, 97.5]))
    assert percentile_interval(np.arange(101.0), level=0.9) == (5.0, 95.0)


def test_undefined_metrics_give_nan_intervals():
    rows = pd.DataFrame(
        [(f"s{i}", "abstained", None, -1, "x", "") for i in range(8)], columns=COLUMNS
    )
    intervals = clustered_bootstrap(build_count_table(rows), n_resamples=50)
    assert intervals["abstention_rate"] == (1.0, 1.0)
    assert all(math.isnan(v) for v in intervals["accuracy"])
    empty = clustered_bootstrap(build_count_table(rows.iloc[:0]), n_resamples=10)
    assert all(math.isnan(v) for interval in empty.values() for v in interval)


def test_interval_allowed_needs_min_subjects():
    def table_with(n: int):
        rows = [(f"s{i}", "answered", True, 50, "x", "x") for i in range(n)]
        return build_count_table(pd.DataFrame(rows, columns=COLUMNS))

    assert MIN_SUBJECTS == 5
    assert not interval_allowed(table_with(MIN_SUBJECTS - 1))
    assert interval_allowed(table_with(MIN_SUBJECTS))


@pytest.mark.parametrize(
    ("kwargs", "message"), [({"n_resamples": 0}, "n_resamples"), ({"level": 1.0}, "level")]
)
def test_bad_arguments_are_rejected(kwargs, message):
    table = build_count_table(random_rows(3, n=100, n_subjects=5))
    with pytest.raises(ValueError, match=message):
        clustered_bootstrap(table, **kwargs)
