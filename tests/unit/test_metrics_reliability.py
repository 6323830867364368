"""The reliability metrics beyond the headline ones, against row-level oracles and scikit-learn."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import f1_score, roc_auc_score

from grader.metrics import (
    METRIC_NAMES,
    build_count_table,
    compute_metrics,
    point_metrics,
    risk_coverage_curve,
)
from tests.unit.test_metrics import COLUMNS, frame, random_rows


def with_conf(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(confidence percent, correct) of answered rows that stated a confidence."""
    answered = rows[(rows.outcome == "answered") & (rows.confidence >= 0)]
    return answered.confidence.to_numpy(dtype=np.int64), answered.correct.to_numpy(dtype=bool)


def bins_of(conf: np.ndarray) -> np.ndarray:
    return np.minimum(conf // 10, 9)


def loop_mce(conf: np.ndarray, ok: np.ndarray) -> float:
    b = bins_of(conf)
    return max(abs(ok[b == k].mean() - conf[b == k].mean() / 100) for k in np.unique(b))


def loop_ece_levels(conf: np.ndarray, ok: np.ndarray) -> float:
    return sum(
        (conf == c).sum() / len(conf) * abs(ok[conf == c].mean() - c / 100) for c in np.unique(conf)
    )


def kumar_debiased(conf: np.ndarray, ok: np.ndarray) -> float:
    """Kumar et al.'s ``unbiased_l2_ce`` (the ``calibration`` package), on our ten bins."""
    b = bins_of(conf)
    total = 0.0
    for k in range(10):
        in_bin = b == k
        n = int(in_bin.sum())
        if n < 2:
            continue
        mean_label = ok[in_bin].mean()
        biased = (ok[in_bin].mean() - conf[in_bin].mean() / 100) ** 2
        total += n / len(conf) * (biased - mean_label * (1 - mean_label) / (n - 1))
    return max(total, 0.0) ** 0.5


def loop_overconfidence(conf: np.ndarray, ok: np.ndarray) -> float:
    b = bins_of(conf)
    out = 0.0
    for k in np.unique(b):
        c, a = conf[b == k].mean() / 100, ok[b == k].mean()
        out += (b == k).sum() / len(conf) * c * max(c - a, 0.0)
    return out


def expected_prefix_risks(conf: np.ndarray, ok: np.ndarray) -> list[Fraction]:
    """Exact E[risk of the k most confident] over every order of tied answers (brute force)."""
    levels = sorted(set(conf.tolist()), reverse=True)
    groups = [[bool(o) for c, o in zip(conf, ok, strict=True) if c == lv] for lv in levels]
    orders = [sorted(set(itertools.permutations(g))) for g in groups]
    sums = [Fraction(0)] * len(conf)
    count = 0
    for combo in itertools.product(*orders):
        flat = [o for group in combo for o in group]
        wrong = 0
        for k, o in enumerate(flat, start=1):
            wrong += not o
            sums[k - 1] += Fraction(wrong, k)
        count += 1
    return [s / count for s in sums]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_against_sklearn_and_loops(seed):
    rows = random_rows(seed)
    m = point_metrics(build_count_table(rows))
    answered = rows[rows.outcome == "answered"]
    conf, ok = with_conf(rows)

    assert m["auroc"] == pytest.approx(roc_auc_score(ok, conf), rel=1e-12)
    assert m["macro_f1"] == pytest.approx(
        f1_score(answered.true_class, answered.pred_class, average="macro"), rel=1e-12
    )
    assert m["mce"] == pytest.approx(loop_mce(conf, ok), rel=1e-12)
    assert m["ece_levels"] == pytest.approx(loop_ece_levels(conf, ok), rel=1e-12)
    assert m["ece_debiased"] == pytest.approx(kumar_debiased(conf, ok), rel=1e-9)
    assert m["overconfidence_error"] == pytest.approx(loop_overconfidence(conf, ok), rel=1e-12)


def test_macro_f1_counts_classes_only_predicted():
    rows = [
        ("s", "answered", True, 80, "a", "a"),
        ("s", "answered", False, 80, "a", "b"),  # "b" is never true
        ("s", "answered", True, 80, "c", "c"),
    ]
    got = point_metrics(build_count_table(frame(rows)))["macro_f1"]
    expected = f1_score(["a", "a", "c"], ["a", "b", "c"], average="macro", zero_division=0)
    assert got == pytest.approx(expected) == pytest.approx((2 / 3 + 0 + 1) / 3)


def test_auroc_ties_count_half_and_is_undefined_without_both_kinds():
    rows = [("s", "answered", True, 70, "x", "x"), ("s", "answered", False, 70, "x", "y")]
    assert point_metrics(build_count_table(frame(rows)))["auroc"] == 0.5
    only_right = [("s", "answered", True, 70, "x", "x")]
    assert math.isnan(point_metrics(build_count_table(frame(only_right)))["auroc"])


@pytest.mark.parametrize("seed", range(6))
def test_aurc_and_selective_accuracy_equal_brute_force_over_tie_orders(seed):
    rng = np.random.default_rng(seed)
    n = 7
    conf = rng.choice([40, 70, 90, 100], n)
    ok = rng.random(n) < 0.6
    rows = frame(
        [
            ("s", "answered", bool(o), int(c), "x", "x" if o else "y")
            for c, o in zip(conf, ok, strict=True)
        ]
    )
    m = point_metrics(build_count_table(rows))
    risks = expected_prefix_risks(conf, ok)
    assert m["aurc"] == pytest.approx(float(sum(risks) / n), rel=1e-12)
    n_right = int(ok.sum())
    optimal = sum(Fraction(max(0, k - n_right), k) for k in range(1, n + 1)) / n
    assert m["e_aurc"] == pytest.approx(float(sum(risks) / n - optimal), abs=1e-12)
    # 80% of 7 = 5.6 answers: the expected correct among the first 5, plus 0.6 of the sixth.
    correct_5 = 5 * (1 - risks[4])
    correct_6 = 6 * (1 - risks[5])
    expected = (correct_5 + Fraction(3, 5) * (correct_6 - correct_5)) / Fraction(28, 5)
    assert m["selective_accuracy_80"] == pytest.approx(float(expected), rel=1e-12)


def test_aurc_without_ties_is_the_mean_prefix_risk():
    rng = np.random.default_rng(9)
    conf = rng.permutation(101)[:60]
    ok = rng.random(60) < 0.5
    order = np.argsort(-conf)
    prefix_risk = np.cumsum(~ok[order]) / np.arange(1, 61)
    rows = frame(
        [("s", "answered", bool(o), int(c), "x", "x") for c, o in zip(conf, ok, strict=True)]
    )
    m = point_metrics(build_count_table(rows))
    assert m["aurc"] == pytest.approx(prefix_risk.mean(), rel=1e-12)
    assert m["selective_accuracy_80"] == pytest.approx(ok[order][:48].mean(), rel=1e-12)


def test_perfect_ranking_has_zero_e_aurc():
    rows = frame(
        [("s", "answered", True, 90, "x", "x")] * 3 + [("s", "answered", False, 20, "x", "y")] * 2
    )
    m = point_metrics(build_count_table(rows))
    assert m["e_aurc"] == pytest.approx(0.0, abs=1e-15)
    assert m["auroc"] == 1.0 and m["selective_accuracy_80"] == 3 / 4


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_murphy_decomposition_is_exact(seed):
    rows = random_rows(seed, n=800, n_subjects=10)
    m = point_metrics(build_count_table(rows))
    conf, ok = with_conf(rows)
    # Exact rational arithmetic: the identity holds with no rounding at all.
    n = len(conf)
    brier = sum((Fraction(int(c), 100) - int(o)) ** 2 for c, o in zip(conf, ok, strict=True)) / n
    base = Fraction(int(ok.sum()), n)
    rel = res = Fraction(0)
    for level in np.unique(conf):
        at = conf == level
        n_c, o_c = int(at.sum()), Fraction(int(ok[at].sum()), int(at.sum()))
        rel += n_c * (Fraction(int(level), 100) - o_c) ** 2 / n
        res += n_c * (o_c - base) ** 2 / n
    unc = base * (1 - base)
    assert rel - res + unc == brier
    assert m["brier_reliability"] == pytest.approx(float(rel), rel=1e-12)
    assert m["brier_resolution"] == pytest.approx(float(res), rel=1e-12)
    assert m["brier_uncertainty"] == pytest.approx(float(unc), rel=1e-12)
    # And in floating point, to the last few bits.
    identity = m["brier_reliability"] - m["brier_resolution"] + m["brier_uncertainty"]
    assert identity == pytest.approx(m["brier"], abs=1e-15)


def test_murphy_on_bootstrap_batches():
    table = build_count_table(random_rows(4))
    weights = np.random.default_rng(0).integers(0, 3, size=(50, table.n_subjects)).astype(float)
    m = compute_metrics(weights @ table.counts, table.layout)
    identity = m["brier_reliability"] - m["brier_resolution"] + m["brier_uncertainty"]
    np.testing.assert_allclose(identity, m["brier"], rtol=0, atol=1e-14)


def open_rows() -> pd.DataFrame:
    """Hallucination and abstention columns on a few rows, worked by hand in the test."""
    base = [
        ("s1", "answered", True, 80, "no", "no"),  # halluc 0, valid
        ("s1", "answered", False, 90, "no", "yes"),  # halluc 1, valid
        ("s1", "abstained", None, -1, "no", ""),  # halluc 0 (a refusal), valid, abstained
        ("s2", "abstained", None, -1, "UNSURE", ""),  # expects abstention: abstained
        ("s2", "answered", False, 95, "UNSURE", "T1"),  # expects abstention: answered
        ("s2", "transport_error", None, -1, "UNSURE", ""),  # expects, but not gradeable
        ("s2", "abstained", None, -1, "no", ""),  # control (is_brain on noise): not valid
        ("s2", "answered", True, 60, "T1", "T1"),  # multiple choice: halluc -1
    ]
    df = frame(base)
    df["hallucinated"] = [0, 1, 0, -1, -1, -1, -1, -1]
    df["expect_abstain"] = [False, False, False, True, True, True, False, False]
    df["is_control"] = [False, False, False, True, True, True, True, False]
    return df


def test_hallucination_and_abstention_by_hand():
    m = point_metrics(build_count_table(open_rows()))
    assert m["hallucination_rate"] == 1 / 3
    assert m["abstention_appropriate"] == 1 / 2  # 1 of 2 gradeable rows that expect it
    assert m["over_abstention"] == 1 / 4  # rows 1, 2, 3, 8 are valid; row 3 abstained


def test_optional_columns_default_and_nulls_read_as_defaults():
    df = open_rows()
    df["hallucinated"] = pd.array([0, 1, pd.NA, None, None, None, None, None], dtype="Int64")
    df["expect_abstain"] = pd.array([False, False, False, True, True, True, None, None], "boolean")
    m = point_metrics(build_count_table(df))
    assert m["hallucination_rate"] == 1 / 2
    bare = point_metrics(build_count_table(df[COLUMNS]))
    assert math.isnan(bare["hallucination_rate"]) and math.isnan(bare["abstention_appropriate"])
    assert bare["over_abstention"] == 3 / 7  # every gradeable row is valid without the columns


def test_bad_hallucinated_values_are_rejected():
    df = open_rows()
    df.loc[0, "hallucinated"] = 2
    with pytest.raises(ValueError, match="hallucinated"):
        build_count_table(df)


def test_risk_coverage_curve():
    rows = frame(
        [
            ("s", "answered", True, 100, "x", "x"),
            ("s", "answered", False, 90, "x", "y"),
            ("s", "answered", True, 90, "x", "x"),
            ("s", "answered", False, 30, "x", "y"),
            ("s", "answered", True, -1, "x", "x"),  # no confidence: not on the curve
        ]
    )
    table = build_count_table(rows)
    curve = risk_coverage_curve(table.totals(), table.layout)
    assert curve.threshold_pct.tolist() == [100, 90, 30]
    assert curve.coverage.tolist() == [0.25, 0.75, 1.0]
    assert curve.risk.tolist() == pytest.approx([0.0, 1 / 3, 0.5])
    with pytest.raises(ValueError, match="shape"):
        risk_coverage_curve(np.zeros(3), table.layout)


def test_every_metric_is_finite_or_nan_on_random_batches():
    table = build_count_table(random_rows(7))
    weights = np.random.default_rng(1).integers(0, 4, size=(30, table.n_subjects)).astype(float)
    weights[0] = 0
    with np.errstate(all="raise"):
        batch = compute_metrics(weights @ table.counts, table.layout)
    for name in METRIC_NAMES:
        assert batch[name].shape == (30,)
        assert not np.any(np.isinf(batch[name])), name
        assert math.isnan(batch[name][0]), name
