"""BCa intervals from the subject-clustered bootstrap, with a leave-one-subject-out jackknife."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import scipy.stats

from grader.bootstrap import (
    bca_interval,
    clustered_bootstrap,
    jackknife_metrics,
    percentile_interval,
    resampled_metrics,
)
from grader.metrics import METRIC_NAMES, build_count_table, compute_metrics
from tests.unit.test_bootstrap import same
from tests.unit.test_metrics import COLUMNS, random_rows


def one_row_per_subject(n: int, p: float, seed: int) -> pd.DataFrame:
    ok = np.random.default_rng(seed).random(n) < p
    rows = [
        (f"s{i:04d}", "answered", bool(o), 80, "x", "x" if o else "y") for i, o in enumerate(ok)
    ]
    return pd.DataFrame(rows, columns=COLUMNS)


def test_bca_is_deterministic_and_covers_every_metric():
    table = build_count_table(random_rows(0))
    first = clustered_bootstrap(table, n_resamples=300, seed=4, method="bca")
    assert same(first, clustered_bootstrap(table, n_resamples=300, seed=4, method="bca"))
    assert set(first) == set(METRIC_NAMES)
    assert not same(first, clustered_bootstrap(table, n_resamples=300, seed=4))


def test_jackknife_leaves_one_subject_out():
    rows = random_rows(1, n=600, n_subjects=8)
    table = build_count_table(rows)
    jack = jackknife_metrics(table)
    for i, subject in enumerate(table.subjects):
        rest = build_count_table(rows[rows.subject_id != subject], classes=table.classes)
        expected = compute_metrics(rest.totals(), rest.layout)
        for name in ("accuracy", "ece", "auroc", "brier"):
            assert jack[name][i] == pytest.approx(float(expected[name]), rel=1e-12)


def test_bca_matches_scipy_when_every_subject_has_one_row():
    # With one row per subject the clustered bootstrap is the ordinary one, so scipy's BCa for
    # the mean of 0/1 correctness is an oracle (up to Monte Carlo error of the resamples).
    rows = one_row_per_subject(150, 0.8, seed=3)
    table = build_count_table(rows)
    ours = clustered_bootstrap(table, n_resamples=20000, seed=0, method="bca")["accuracy"]
    data = rows.correct.to_numpy(dtype=float)
    theirs = scipy.stats.bootstrap(
        (data,), np.mean, n_resamples=20000, method="BCa", rng=np.random.default_rng(1)
    ).confidence_interval
    assert ours[0] == pytest.approx(theirs.low, abs=0.01)
    assert ours[1] == pytest.approx(theirs.high, abs=0.01)
    # A skewed statistic: BCa moves both ends away from the percentile interval's.
    percentile = clustered_bootstrap(table, n_resamples=20000, seed=0)["accuracy"]
    assert ours != percentile


def test_bca_by_hand_formula():
    rng = np.random.default_rng(0)
    values = rng.normal(0.5, 0.1, 2000)
    jack = rng.normal(0.5, 0.01, 30)
    (lower, upper), used = bca_interval(values, 0.52, jack, level=0.9)
    assert used
    z0 = scipy.stats.norm.ppf(((values < 0.52).sum() + (values <= 0.52).sum()) / 2 / 2000)
    d = jack.mean() - jack
    a = (d**3).sum() / (6 * ((d**2).sum()) ** 1.5)
    z = scipy.stats.norm.ppf([0.05, 0.95])
    tails = scipy.stats.norm.cdf(z0 + (z0 + z) / (1 - a * (z0 + z)))
    assert (lower, upper) == tuple(np.percentile(values, 100 * tails))


@pytest.mark.parametrize(
    ("values", "point", "jack"),
    [
        (np.full(100, 0.5), 0.5, np.linspace(0.4, 0.6, 10)),  # every resample equal
        (np.linspace(0, 1, 100), 2.0, np.linspace(0.4, 0.6, 10)),  # point above all: z0 = inf
        (np.linspace(0, 1, 100), 0.5, np.full(10, 0.5)),  # no jackknife spread: a = 0 / 0
        (np.linspace(0, 1, 100), 0.5, np.array([0.5, np.nan] * 5)),  # undefined leave-one-out
        (np.linspace(0, 1, 100), 0.5, np.linspace(0.4, 0.6, 3)),  # too few subjects
        (np.linspace(0, 1, 100), math.nan, np.linspace(0.4, 0.6, 10)),  # undefined point
    ],
)
def test_degenerate_cases_fall_back_to_percentile(values, point, jack):
    interval, used = bca_interval(values, point, jack)
    assert not used
    assert np.array_equal(interval, percentile_interval(values), equal_nan=True)


def test_small_tables_and_constant_metrics_fall_back():
    few = build_count_table(one_row_per_subject(4, 0.5, seed=0))
    assert same(
        clustered_bootstrap(few, n_resamples=100, method="bca"),
        clustered_bootstrap(few, n_resamples=100),
    )
    table = build_count_table(random_rows(2, n=500, n_subjects=12))
    bca = clustered_bootstrap(table, n_resamples=200, seed=1, method="bca")
    pct = clustered_bootstrap(table, n_resamples=200, seed=1)
    # No hallucination column: undefined in every resample, NaN either way.
    assert all(math.isnan(v) for v in bca["hallucination_rate"])
    assert same({"a": bca["hallucination_rate"]}, {"a": pct["hallucination_rate"]})
    resampled = resampled_metrics(table, n_resamples=200, seed=1)
    for name in METRIC_NAMES:
        lower, upper = bca[name]
        if not math.isnan(lower):
            finite = resampled[name][~np.isnan(resampled[name])]
            assert finite.min() <= lower <= upper <= finite.max(), name


def test_unknown_method_is_rejected():
    table = build_count_table(random_rows(3, n=100, n_subjects=5))
    with pytest.raises(ValueError, match="method"):
        clustered_bootstrap(table, method="basic")  # type: ignore[arg-type]
