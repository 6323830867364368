"""Every metric from one count table: hand-computed fixtures and oracles on random data."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import balanced_accuracy_score, brier_score_loss

from grader.metrics import (
    METRIC_NAMES,
    N_LEVELS,
    Layout,
    build_count_table,
    compute_metrics,
    point_metrics,
    reliability_bins,
)

COLUMNS = ["subject_id", "outcome", "correct", "confidence", "true_class", "pred_class"]


def frame(rows: list[tuple]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=COLUMNS)


# Two subjects, ten rows. Worked by hand:
#   responses 10; transport errors 1 (r9) -> gradeable 9
#   answered 7 (r1 r2 r3 r4 r6 r7 r10), abstained 1 (r5), unparseable 1 (r8)
#   correct 4 (r1 r3 r7 r10)
#   coverage = 7/9, accuracy = 4/7, abstention = 1/9, unparseable = 1/9, transport = 1/10
#   balanced accuracy over true classes of answered rows:
#     axial r1 ok, r4 wrong, r10 ok -> 2/3; coronal r2 wrong, r3 ok -> 1/2;
#     sagittal r6 wrong, r7 ok -> 1/2; mean = (2/3 + 1/2 + 1/2) / 3 = 5/9
#   with confidence (N = 5): r1 30 ok, r2 60 wrong, r3 100 ok, r6 90 wrong, r7 85 ok
#     bins: 30 -> 3, 60 -> 6, 85 -> 8, 90 -> 9, 100 -> 9 (the top bin)
#     ECE = 1/5 |1 - .30| + 1/5 |0 - .60| + 1/5 |1 - .85| + 2/5 |1/2 - .95|
#         = (.70 + .60 + .15) / 5 + .18 = .47
#     Brier = (.49 + .36 + 0 + .81 + .0225) / 5 = 1.6825 / 5 = .3365
#     mean confidence = (.30 + .60 + 1.00 + .90 + .85) / 5 = .73
#   conf_wrong = mean(.60, .90) = .75 (r4 is wrong but has no confidence)
#   cw_rate = #(wrong, c >= 80) / answered = 1 (r6) / 7
#   missing_conf_rate = 2 (r4 r10) / 7
HAND_ROWS = [
    ("s1", "answered", True, 30, "axial", "axial"),  # r1
    ("s1", "answered", False, 60, "coronal", "axial"),  # r2
    ("s1", "answered", True, 100, "coronal", "coronal"),  # r3
    ("s1", "answered", False, -1, "axial", "sagittal"),  # r4
    ("s1", "abstained", None, 20, "axial", ""),  # r5
    ("s2", "answered", False, 90, "sagittal", "axial"),  # r6
    ("s2", "answered", True, 85, "sagittal", "sagittal"),  # r7
    ("s2", "unparseable", None, -1, "coronal", ""),  # r8
    ("s2", "transport_error", None, -1, "axial", ""),  # r9
    ("s2", "answered", True, -1, "axial", "axial"),  # r10
]
HAND_EXPECTED = {
    "coverage": 7 / 9,
    "accuracy": 4 / 7,
    "balanced_accuracy": 5 / 9,
    "ece": 0.47,
    "brier": 0.3365,
    "conf_wrong": 0.75,
    "cw_rate": 1 / 7,
    "abstention_rate": 1 / 9,
    "unparseable_rate": 1 / 9,
    "missing_conf_rate": 2 / 7,
    "transport_error_rate": 1 / 10,
    "mean_confidence": 0.73,
    # Per class over answered rows: axial TP 2 (r1 r10), true 3, predicted 4 -> F1 4/7;
    # coronal TP 1, true 2, predicted 1 -> 2/3; sagittal TP 1, true 2, predicted 2 -> 1/2.
    "macro_f1": (4 / 7 + 2 / 3 + 1 / 2) / 3,
    # One answer per stated level: (.70 + .60 + 0 + .90 + .15) / 5.
    "ece_levels": 0.47,
    # Bins 3, 6, 8 hold one answer each (no debiasing term); bin 9 holds two (acc .5, conf .95):
    # (.45^2 - .5 * .5 / 1) * 2/5 < 0, clipped to 0.
    "ece_debiased": 0.0,
    "mce": 0.70,  # bin 3: |1 - .30|
    # bin 6: .60 * (.60 - 0) / 5; bin 9: .95 * (.95 - .5) * 2 / 5; bins 3 and 8 underconfident.
    "overconfidence_error": 0.60 * 0.60 / 5 + 0.95 * 0.45 * 2 / 5,
    # One answer per level, so reliability is the Brier score; o = 3/5:
    # resolution = (3 * .4^2 + 2 * .6^2) / 5 = .24, uncertainty = .6 * .4 = .24.
    "brier_reliability": 0.3365,
    "brier_resolution": 0.24,
    "brier_uncertainty": 0.24,
    # Right at 30, 85, 100; wrong at 60, 90: 100 beats both, 85 beats 60 -> 3 of 6 pairs.
    "auroc": 0.5,
    # By confidence: 100 ok, 90 wrong, 85 ok, 60 wrong, 30 ok; prefix risks 0, 1/2, 1/3, 2/4,
    # 2/5; AURC = their mean. Perfect ranking: 0, 0, 0, 1/4, 2/5.
    "aurc": (0 + 1 / 2 + 1 / 3 + 2 / 4 + 2 / 5) / 5,
    "e_aurc": (0 + 1 / 2 + 1 / 3 + 2 / 4 + 2 / 5) / 5 - (1 / 4 + 2 / 5) / 5,
    "selective_accuracy_80": 2 / 4,  # the 4 most confident: 100 ok, 90 no, 85 ok, 60 no
    "hallucination_rate": math.nan,  # no hallucinated column: nothing graded for it
    "abstention_appropriate": math.nan,  # no item expects an abstention
    "over_abstention": 1 / 9,  # every gradeable row is a valid item; r5 abstained
}


@pytest.fixture
def hand_table():
    return build_count_table(frame(HAND_ROWS))


def test_metric_names_are_the_contract():
    assert set(METRIC_NAMES) == set(HAND_EXPECTED)


@pytest.mark.parametrize("name", sorted(HAND_EXPECTED))
def test_hand_computed_metric(hand_table, name):
    metrics = compute_metrics(hand_table.totals(), hand_table.layout)
    assert metrics[name] == pytest.approx(HAND_EXPECTED[name], abs=1e-12, nan_ok=True)


def test_table_shape_and_blocks(hand_table):
    layout = hand_table.layout
    assert list(hand_table.subjects) == ["s1", "s2"]
    assert list(hand_table.classes) == ["axial", "coronal", "sagittal"]
    assert hand_table.counts.shape == (2, 5 + 2 * N_LEVELS + 2 + 6 + 3 * 3)
    assert hand_table.counts.dtype == np.float64
    assert len(layout.feature_names()) == layout.n_features
    s1, s2 = hand_table.counts
    assert s1[[0, 1, 2, 3, 4]].tolist() == [5, 0, 4, 1, 0]
    assert s2[[0, 1, 2, 3, 4]].tolist() == [5, 1, 3, 0, 1]
    assert s1[layout.correct_at][30] == 1 and s1[layout.correct_at][100] == 1
    assert s1[layout.wrong_at][60] == 1
    assert s1[layout.wrong_noconf] == 1 and s2[layout.correct_noconf] == 1
    assert s1[layout.answered_k].tolist() == [2, 2, 0]  # axial r1 r4, coronal r2 r3
    assert s1[layout.correct_k].tolist() == [1, 1, 0]
    assert s1[layout.predicted_k].tolist() == [2, 1, 1]  # axial r1 r2, coronal r3, sagittal r4
    assert s2[layout.predicted_k].tolist() == [2, 0, 1]


def test_confidence_edges_land_in_integer_bins(hand_table):
    bins = reliability_bins(hand_table.totals(), hand_table.layout)
    assert [(b.lower_pct, b.upper_pct) for b in bins] == [
        (0, 9), (10, 19), (20, 29), (30, 39), (40, 49),
        (50, 59), (60, 69), (70, 79), (80, 89), (90, 100),
    ]  # fmt: skip
    assert [b.count for b in bins] == [0, 0, 0, 1, 0, 0, 1, 0, 1, 2]
    assert bins[3].mean_conf == pytest.approx(0.30) and bins[3].accuracy == 1.0
    assert bins[6].mean_conf == pytest.approx(0.60) and bins[6].accuracy == 0.0
    assert bins[9].mean_conf == pytest.approx(0.95) and bins[9].accuracy == 0.5
    assert math.isnan(bins[0].mean_conf) and math.isnan(bins[0].accuracy)


def test_float_edges_would_misbin_30_and_60():
    # The trap the integer bins avoid: linspace edges put 0.3 and 0.6 one bin too low.
    edges = np.linspace(0, 1, 11)
    naive = np.digitize([0.3, 0.6], edges) - 1
    assert naive.tolist() == [2, 5]
    for pct, expected_bin in [(30, 3), (60, 6), (100, 9), (99, 9), (90, 9), (89, 8), (0, 0)]:
        table = build_count_table(frame([("s", "answered", True, pct, "x", "x")]))
        counts = [b.count for b in reliability_bins(table.totals(), table.layout)]
        assert counts.index(1) == expected_bin, pct


def test_confidence_100_is_in_top_bin_for_ece():
    # One correct answer at 100: |1 - 1.00| = 0; one wrong at 100 alone: |0 - 1| = 1.
    ok = build_count_table(frame([("s", "answered", True, 100, "x", "x")]))
    wrong = build_count_table(frame([("s", "answered", False, 100, "x", "y")]))
    assert compute_metrics(ok.totals(), ok.layout)["ece"] == 0.0
    assert compute_metrics(wrong.totals(), wrong.layout)["ece"] == 1.0
    assert compute_metrics(wrong.totals(), wrong.layout)["cw_rate"] == 1.0


def test_missing_confidence_counts_for_coverage_and_accuracy_only():
    with_conf = [("s", "answered", True, 70, "x", "x"), ("s", "answered", False, 40, "x", "y")]
    without = [("s", "answered", False, -1, "x", "y"), ("s", "answered", False, None, "x", "y")]
    table = build_count_table(frame(with_conf + without))
    m = compute_metrics(table.totals(), table.layout)
    assert m["coverage"] == 1.0
    assert m["accuracy"] == 0.25  # 1 of 4 answered
    assert m["missing_conf_rate"] == 0.5
    # ECE and Brier only over the two rows with a confidence:
    # bins 7 (ok, .70) and 4 (wrong, .40): ECE = (.30 + .40) / 2; Brier = (.09 + .16) / 2.
    assert m["ece"] == pytest.approx(0.35)
    assert m["brier"] == pytest.approx(0.125)
    assert m["conf_wrong"] == pytest.approx(0.40)
    assert m["mean_confidence"] == pytest.approx(0.55)


def test_abstained_and_unparseable_are_non_coverage_not_wrong():
    rows = [
        ("s", "answered", True, 90, "x", "x"),
        ("s", "abstained", False, 10, "x", ""),
        ("s", "unparseable", False, 95, "x", ""),
        ("s", "unparseable", False, -1, "x", ""),
    ]
    table = build_count_table(frame(rows))
    m = compute_metrics(table.totals(), table.layout)
    assert m["coverage"] == 0.25
    assert m["accuracy"] == 1.0
    assert m["balanced_accuracy"] == 1.0
    assert m["abstention_rate"] == 0.25
    assert m["unparseable_rate"] == 0.5
    assert m["cw_rate"] == 0.0
    assert m["brier"] == pytest.approx(0.01)
    assert math.isnan(m["conf_wrong"])  # no wrong answers at all


def test_transport_errors_leave_coverage_denominator():
    rows = [
        ("s", "answered", True, 50, "x", "x"),
        ("s", "abstained", None, -1, "x", ""),
        ("s", "transport_error", None, -1, "x", ""),
        ("s", "transport_error", None, -1, "x", ""),
    ]
    table = build_count_table(frame(rows))
    m = compute_metrics(table.totals(), table.layout)
    assert m["coverage"] == 0.5  # 1 answered of 2 gradeable
    assert m["abstention_rate"] == 0.5
    assert m["transport_error_rate"] == 0.5  # 2 of 4 responses


def test_zero_denominators_are_nan_not_errors():
    only_transport = build_count_table(frame([("s", "transport_error", None, -1, "x", "")]))
    m = compute_metrics(only_transport.totals(), only_transport.layout)
    assert m["transport_error_rate"] == 1.0
    assert all(math.isnan(m[name]) for name in METRIC_NAMES if name != "transport_error_rate")

    only_abstained = build_count_table(frame([("s", "abstained", None, -1, "x", "")]))
    m = compute_metrics(only_abstained.totals(), only_abstained.layout)
    assert m["coverage"] == 0.0 and m["abstention_rate"] == 1.0
    for name in ("accuracy", "balanced_accuracy", "ece", "brier", "cw_rate", "mean_confidence"):
        assert math.isnan(m[name]), name

    empty = build_count_table(frame([]))
    assert empty.counts.shape == (0, empty.layout.n_features)
    assert all(math.isnan(v) for v in point_metrics(empty).values())


def test_balanced_accuracy_skips_classes_without_answers():
    # "coronal" is only ever predicted, never the true class of an answered row.
    rows = [
        ("s", "answered", True, 80, "axial", "axial"),
        ("s", "answered", False, 80, "axial", "coronal"),
        ("s", "answered", True, 80, "sagittal", "sagittal"),
        ("s", "abstained", None, -1, "coronal", ""),
    ]
    table = build_count_table(frame(rows))
    assert list(table.classes) == ["axial", "coronal", "sagittal"]
    assert point_metrics(table)["balanced_accuracy"] == pytest.approx((0.5 + 1.0) / 2)


def test_given_classes_fix_the_axis_and_reject_strangers():
    rows = [("s", "answered", True, 80, "no", "no")]
    table = build_count_table(frame(rows), classes=["yes", "no"])
    assert list(table.classes) == ["yes", "no"]
    assert table.counts[0][table.layout.answered_k].tolist() == [0, 1]
    with pytest.raises(ValueError, match="not in the given classes"):
        build_count_table(frame(rows), classes=["yes"])
    with pytest.raises(ValueError, match="distinct"):
        build_count_table(frame(rows), classes=["no", "no"])
    with pytest.raises(ValueError, match="no true_class"):
        build_count_table(frame([("s", "answered", True, 80, "", "no")]))


def test_nullable_columns_read_as_missing():
    rows = pd.DataFrame(
        {
            "subject_id": ["a", "b", "c"],
            "outcome": ["answered"] * 3,
            "correct": pd.array([True, False, pd.NA], dtype="boolean"),
            "confidence": pd.array([50, pd.NA, 70], dtype="Int64"),
            "true_class": ["x", "x", "y"],
            "pred_class": ["x", "y", None],
        }
    )
    m = point_metrics(build_count_table(rows))
    assert m["accuracy"] == pytest.approx(1 / 3)  # NA correct reads as not correct
    assert m["missing_conf_rate"] == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([("s", "answered", True, 101, "x", "x")], "integer percent"),
        ([("s", "answered", True, -2, "x", "x")], "integer percent"),
        ([("s", "answered", True, 50.5, "x", "x")], "integer percent"),
        ([("s", "timeout", None, -1, "x", "")], "unknown outcomes"),
    ],
)
def test_bad_rows_are_rejected(rows, message):
    with pytest.raises(ValueError, match=message):
        build_count_table(frame(rows))


def test_missing_column_is_rejected():
    with pytest.raises(ValueError, match="lack columns"):
        build_count_table(frame(HAND_ROWS).drop(columns=["pred_class"]))


def test_confidence_of_unanswered_rows_is_not_validated():
    # Only answered rows carry a graded confidence; an abstention may state anything.
    table = build_count_table(frame([("s", "abstained", None, 250, "x", "")]))
    assert point_metrics(table)["abstention_rate"] == 1.0


def test_compute_metrics_rejects_wrong_width(hand_table):
    with pytest.raises(ValueError, match="shape"):
        compute_metrics(np.zeros(3), hand_table.layout)
    with pytest.raises(ValueError, match="shape"):
        reliability_bins(np.zeros((2, hand_table.layout.n_features)), hand_table.layout)


# ---------------------------------------------------------------------------------------------
# Oracles on random data

CLASSES = ["T1", "T1ce", "T2", "FLAIR", "PD", "MRA", "DWI"]


def random_rows(seed: int, n: int = 3000, n_subjects: int = 40) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    outcome = rng.choice(
        ["answered", "abstained", "unparseable", "transport_error"], n, p=[0.85, 0.05, 0.05, 0.05]
    )
    true_class = rng.choice(CLASSES, n, p=[0.3, 0.2, 0.2, 0.1, 0.1, 0.05, 0.05])
    guess = rng.choice(CLASSES, n)
    pred_class = np.where(rng.random(n) < 0.5, true_class, guess)
    answered = outcome == "answered"
    confidence = rng.integers(0, 101, n)
    confidence = np.where(rng.random(n) < 0.1, -1, confidence)
    # Put weight on the bin edges.
    confidence = np.where(rng.random(n) < 0.2, rng.choice([0, 30, 60, 90, 99, 100], n), confidence)
    return pd.DataFrame(
        {
            "subject_id": [f"sub-{i:03d}" for i in rng.integers(0, n_subjects, n)],
            "outcome": outcome,
            "correct": answered & (pred_class == true_class),
            "confidence": confidence,
            "true_class": true_class,
            "pred_class": np.where(answered, pred_class, ""),
        }
    )


def loop_ece(conf_pct: np.ndarray, correct: np.ndarray) -> float:
    """The textbook definition, one row at a time."""
    n_bin = [0] * 10
    sum_conf = [0.0] * 10
    sum_ok = [0] * 10
    for c, ok in zip(conf_pct.tolist(), correct.tolist(), strict=True):
        b = min(c // 10, 9)
        n_bin[b] += 1
        sum_conf[b] += c / 100
        sum_ok[b] += int(ok)
    total = sum(n_bin)
    return sum(
        n_bin[b] / total * abs(sum_ok[b] / n_bin[b] - sum_conf[b] / n_bin[b])
        for b in range(10)
        if n_bin[b]
    )


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_metrics_match_row_level_oracles(seed):
    rows = random_rows(seed)
    m = point_metrics(build_count_table(rows))

    answered = rows[rows.outcome == "answered"]
    with_conf = answered[answered.confidence >= 0]
    gradeable = rows[rows.outcome != "transport_error"]
    correct = with_conf.correct.to_numpy()
    prob = with_conf.confidence.to_numpy() / 100

    assert m["balanced_accuracy"] == pytest.approx(
        balanced_accuracy_score(answered.true_class, answered.pred_class), rel=1e-12
    )
    assert m["brier"] == pytest.approx(brier_score_loss(correct, prob), rel=1e-12)
    assert m["ece"] == pytest.approx(loop_ece(with_conf.confidence.to_numpy(), correct), rel=1e-12)
    assert m["accuracy"] == pytest.approx(answered.correct.mean(), rel=1e-12)
    assert m["coverage"] == pytest.approx(len(answered) / len(gradeable), rel=1e-12)
    assert m["abstention_rate"] == pytest.approx(
        (gradeable.outcome == "abstained").mean(), rel=1e-12
    )
    assert m["unparseable_rate"] == pytest.approx(
        (gradeable.outcome == "unparseable").mean(), rel=1e-12
    )
    assert m["transport_error_rate"] == pytest.approx(
        (rows.outcome == "transport_error").mean(), rel=1e-12
    )
    assert m["missing_conf_rate"] == pytest.approx((answered.confidence < 0).mean(), rel=1e-12)
    assert m["mean_confidence"] == pytest.approx(prob.mean(), rel=1e-12)
    assert m["conf_wrong"] == pytest.approx(prob[~correct].mean(), rel=1e-12)
    assert m["cw_rate"] == pytest.approx(
        ((~answered.correct) & (answered.confidence >= 80)).sum() / len(answered), rel=1e-12
    )


def test_batched_totals_equal_one_at_a_time():
    table = build_count_table(random_rows(5))
    rng = np.random.default_rng(0)
    weights = rng.integers(0, 3, size=(20, table.n_subjects)).astype(float)
    weights[3] = 0  # an empty resample: every metric NaN, no error
    batch = compute_metrics(weights @ table.counts, table.layout)
    for name in METRIC_NAMES:
        assert batch[name].shape == (20,)
        single = np.array([compute_metrics(w @ table.counts, table.layout)[name] for w in weights])
        if name in SUMS_OF_RATIOS_PER_LEVEL:
            # Sums of per-level ratios over the levels stated in the batch: the last bit may vary.
            np.testing.assert_allclose(batch[name], single, rtol=1e-13, atol=1e-16)
        else:
            np.testing.assert_array_equal(batch[name], single)
    assert all(np.isnan(batch[name][3]) for name in METRIC_NAMES)


# Metrics summing a ratio per stated level; every other one is a ratio of integer sums, or of
# sums over a fixed axis (bins, classes), and is bit-identical however it is batched.
SUMS_OF_RATIOS_PER_LEVEL = {
    "brier_reliability", "brier_resolution", "aurc", "e_aurc", "selective_accuracy_80",
}  # fmt: skip


def test_batching_with_sparse_levels():
    # Resamples that leave out subjects drop levels: the batch reads levels a single one lacks.
    rows = random_rows(8, n=400, n_subjects=12)
    rows["confidence"] = np.where(rows.confidence >= 0, rows.confidence // 25 * 25, -1)
    table = build_count_table(rows)
    weights = np.eye(table.n_subjects)[:6] * 2
    batch = compute_metrics(weights @ table.counts, table.layout)
    for name in METRIC_NAMES:
        single = np.array([compute_metrics(w @ table.counts, table.layout)[name] for w in weights])
        np.testing.assert_allclose(batch[name], single, rtol=1e-13, atol=1e-16)


def test_table_is_the_sum_of_its_subjects():
    rows = random_rows(6)
    table = build_count_table(rows)
    for subject in table.subjects[:5]:
        alone = build_count_table(rows[rows.subject_id == subject], classes=table.classes)
        row = table.counts[list(table.subjects).index(subject)]
        np.testing.assert_array_equal(alone.counts[0], row)
    assert table.totals()[Layout.responses] == len(rows)


def test_single_totals_give_scalars(hand_table):
    metrics = compute_metrics(hand_table.totals(), hand_table.layout)
    assert all(np.ndim(v) == 0 for v in metrics.values())
    assert all(isinstance(v, float) for v in point_metrics(hand_table).values())
