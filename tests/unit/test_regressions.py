"""Paired regressions between two runs, the clustered McNemar test and regression alerts."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from grader.regressions import clustered_mcnemar, compare_runs, comparison_frame, regression_alerts


def run_rows(right: dict[str, list[bool]], confidence: int = 90) -> pd.DataFrame:
    """subject -> rightness of its items (item k of subject s is item ``s-k``), one task."""
    return pd.DataFrame(
        [
            {"subject_id": s, "item_id": f"{s}-{k}", "task": "plane", "format": "mc",
             "outcome": "answered", "correct": r, "confidence": confidence,
             "true_class": "axial", "pred_class": "axial" if r else "coronal"}
            for s, items in right.items() for k, r in enumerate(items)
        ]
    )  # fmt: skip


def test_clustered_mcnemar_by_hand() -> None:
    base = run_rows({"a": [True, True, False], "b": [True, False], "c": [False]})
    new = run_rows({"a": [False, True, True], "b": [False, False], "c": [True]})
    test = clustered_mcnemar(base, new)
    # b_k - c_k per subject: a: 1 - 1 = 0, b: 1 - 0 = 1, c: 0 - 1 = -1.
    assert (test.base_only_count, test.new_only_count) == (2, 2)
    assert (test.pair_count, test.cluster_count) == (6, 3)
    assert test.statistic == 0.0 and test.p_value == 1.0
    worse = run_rows({"a": [False, False, False], "b": [False, False], "c": [False]})
    test = clustered_mcnemar(base, worse)
    # Differences 2, 1, 0: X2 = 3^2 / (4 + 1) = 1.8.
    assert test.statistic == pytest.approx(1.8)
    assert test.p_value == pytest.approx(stats.chi2.sf(1.8, 1))
    # One item per subject: the ordinary McNemar statistic (b - c)^2 / (b + c).
    one = clustered_mcnemar(run_rows({f"s{i}": [i < 6] for i in range(10)}),
                            run_rows({f"s{i}": [i < 2 or i == 9] for i in range(10)}))  # fmt: skip
    assert one.statistic == pytest.approx((4 - 1) ** 2 / (4 + 1))


def _runs(drop: float, n: int = 30, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    base = {f"s{i:02d}": list(rng.random(8) < 0.8) for i in range(n)}
    new = {s: [r and rng.random() >= drop for r in items] for s, items in base.items()}
    return run_rows(base), run_rows(new)


def test_a_real_drop_regresses_and_alerts() -> None:
    base, new = _runs(drop=0.4)
    cmp = compare_runs(base, new, "r1", "r2", n_resamples=400, seed=0, min_subjects=5)
    acc = next(d for d in cmp.differences if d.task == "all" and d.metric == "accuracy")
    assert acc.difference == acc.value - acc.base_value < -0.2
    assert acc.has_interval and acc.upper < 0 and acc.regressed and acc.direction == 1
    assert acc.mcnemar is not None and acc.mcnemar.p_value < 0.001
    assert {d.task for d in cmp.differences} == {"all", "plane"}
    regressed = {(d.task, d.metric) for d in cmp.regressions()}
    assert ("all", "accuracy") in regressed
    assert all(m not in {"abstention_rate", "transport_error_rate"} for _, m in regressed)
    when = datetime(2026, 1, 1, tzinfo=UTC)
    alerts = regression_alerts(cmp, "m", when)
    assert {a["alert_id"] for a in alerts} >= {"r2:regression:all:accuracy"}
    assert all(a["kind"] == "regression" and a["create_time"] == when for a in alerts)
    assert "fell" in next(a for a in alerts if a["alert_id"].endswith(":all:accuracy"))["message"]
    frame = comparison_frame(cmp, "m")
    assert len(frame) == len(cmp.differences) and frame["regressed"].any()
    # Deterministic: the same inputs give the same comparison.
    again = compare_runs(base, new, "r1", "r2", n_resamples=400, seed=0, min_subjects=5)
    pd.testing.assert_frame_equal(comparison_frame(again, "m"), frame)


def test_no_alert_within_margin_when_better_or_too_few_subjects() -> None:
    base, new = _runs(drop=0.4)
    wide = compare_runs(base, new, "r1", "r2", n_resamples=200, seed=0, min_subjects=5,
                        default_margin=0.9)  # fmt: skip
    assert not wide.regressions()
    better = compare_runs(new, base, "r2", "r3", n_resamples=200, seed=0, min_subjects=5)
    assert not [d for d in better.regressions() if d.metric == "accuracy"]
    few_base, few_new = _runs(drop=0.9, n=3)
    few = compare_runs(few_base, few_new, "r1", "r2", n_resamples=200, seed=0, min_subjects=5)
    assert few.too_few_subjects and not few.regressions()
    assert all(not d.has_interval and math.isnan(d.lower) for d in few.differences)
    same = compare_runs(base, base, "r1", "r1b", n_resamples=200, seed=0, min_subjects=5)
    acc = next(d for d in same.differences if d.task == "all" and d.metric == "accuracy")
    assert acc.difference == 0.0 and (acc.lower, acc.upper) == (0.0, 0.0) and not acc.regressed
