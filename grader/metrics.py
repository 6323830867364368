"""Every audit metric from one count table per (subject, confidence level).

Graded rows are reduced once to a table of counts with one row per subject and a fixed layout of
features (DESIGN.md, "Measuring well"). Every metric is a ratio of sums of those features, so a
metric over any multiset of subjects (the whole table, or a bootstrap resample) only needs the
summed feature vector, and ``compute_metrics`` takes a batch of such vectors at once.

Confidence is binned on the integer percent the model stated (101 levels), never on float edges:
``bin = min(c // 10, 9)``, so 30 falls in bin 3, 60 in bin 6 and 100 in the top bin. The
calibration metrics are computed from integer sums and divided once at the end, so they are exact
up to that final division and do not depend on summation order.

Outcomes are kept apart: abstained and unparseable answers are non-coverage, never wrong;
transport errors are excluded from the coverage denominator; an answer without a stated
confidence counts for coverage and accuracy but not for ECE, Brier or the confidence metrics.

Definitions that have more than one version in the literature:

- ``ece_debiased``: the debiased estimator of the squared l2 calibration error of Kumar, Liang
  and Ma, "Verified Uncertainty Calibration" (NeurIPS 2019, section 5; their ``calibration``
  package, ``get_calibration_error(..., p=2, debias=True)``): per bin,
  ``(acc_b - conf_b)^2 - acc_b (1 - acc_b) / (n_b - 1)`` (bins with fewer than 2 answers add 0),
  weighted by ``n_b / N``, clipped at 0 and square-rooted. The plug-in ECE is biased upwards on
  small groups (a perfectly calibrated model scores above 0); this one is not, to first order.
  It is an l2 (root-mean-square) error, so it is not on the same scale as ``ece``.
- ``brier_reliability`` / ``brier_resolution`` / ``brier_uncertainty``: Murphy's (1973)
  decomposition with the 101 stated levels as the forecast bins. Every forecast in a bin is the
  same number, so reliability - resolution + uncertainty equals the Brier score exactly.
- ``auroc``: the probability that a right answer states a higher confidence than a wrong one,
  ties counted one half (the Mann-Whitney statistic; what ``roc_auc_score`` computes).
- ``aurc``: the area under the risk-coverage curve of Geifman and El-Yaniv (selective risk of
  the k most confident answers, averaged over k = 1..N), with tied confidences taken in random
  order and the expectation computed exactly. ``e_aurc`` subtracts the AURC of a perfect ranking
  with the same accuracy (Geifman et al., "Bias-Reduced Uncertainty Estimation", ICLR 2019).
- ``selective_accuracy_80``: the accuracy of the 80% most confident answers (a tie at the cut
  contributes the matching fraction of its level, i.e. the expectation under random order).
- ``overconfidence_error``: ``sum_b (n_b / N) conf_b max(conf_b - acc_b, 0)`` over the ten bins
  (Thulasidasan et al., "On Mixup Training", NeurIPS 2019).
- ``hallucination_rate``: rows graded for hallucination (``hallucinated`` 0 or 1) that asserted
  an unsupported finding; ``abstention_appropriate``: abstentions over gradeable rows of items
  that expect one (``expect_abstain``); ``over_abstention``: abstentions over gradeable rows of
  valid items (neither ``expect_abstain`` nor ``is_control``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import numpy as np
import pandas as pd
from scipy.special import digamma

from grader.parsing import Outcome

N_LEVELS = 101  # stated confidence 0..100, integer percent
N_BINS = 10
CONFIDENTLY_WRONG_PCT = 80  # "confidently wrong": answered, wrong, confidence >= 0.8
MISSING_CONFIDENCE = -1

SELECTIVE_COVERAGE = 0.8  # the coverage at which selective accuracy is reported

REQUIRED_COLUMNS = ("subject_id", "outcome", "correct", "confidence", "true_class", "pred_class")
# Optional columns and the value a missing column (or a missing value) takes.
OPTIONAL_COLUMNS = {"hallucinated": -1, "expect_abstain": False, "is_control": False}

METRIC_NAMES: tuple[str, ...] = (
    "coverage",
    "accuracy",
    "balanced_accuracy",
    "ece",
    "brier",
    "conf_wrong",
    "cw_rate",
    "abstention_rate",
    "unparseable_rate",
    "missing_conf_rate",
    "transport_error_rate",
    "mean_confidence",
    "macro_f1",
    "ece_levels",
    "ece_debiased",
    "mce",
    "brier_reliability",
    "brier_resolution",
    "brier_uncertainty",
    "auroc",
    "aurc",
    "e_aurc",
    "selective_accuracy_80",
    "overconfidence_error",
    "hallucination_rate",
    "abstention_appropriate",
    "over_abstention",
)

# The fixed head of the feature vector; the per-class blocks follow it.
_RESPONSES = 0
_TRANSPORT_ERROR = 1
_ANSWERED = 2
_ABSTAINED = 3
_UNPARSEABLE = 4
_CORRECT_AT = 5
_WRONG_AT = _CORRECT_AT + N_LEVELS
_CORRECT_NOCONF = _WRONG_AT + N_LEVELS
_WRONG_NOCONF = _CORRECT_NOCONF + 1
_HALLUCINATED = _WRONG_NOCONF + 1
_NOT_HALLUCINATED = _HALLUCINATED + 1
_EXPECT_ABSTAIN = _NOT_HALLUCINATED + 1  # gradeable rows of items that expect an abstention
_EXPECT_ABSTAIN_ABSTAINED = _EXPECT_ABSTAIN + 1
_VALID = _EXPECT_ABSTAIN_ABSTAINED + 1  # gradeable rows of valid items (no control, no abstain)
_VALID_ABSTAINED = _VALID + 1
_PER_CLASS = _VALID_ABSTAINED + 1

_OUTCOME_FEATURE = {
    Outcome.ANSWERED.value: _ANSWERED,
    Outcome.ABSTAINED.value: _ABSTAINED,
    Outcome.UNPARSEABLE.value: _UNPARSEABLE,
    Outcome.TRANSPORT_ERROR.value: _TRANSPORT_ERROR,
}


@dataclass(frozen=True)
class Layout:
    """Where each block sits in a subject's feature vector (length ``n_features``).

    Scalars: ``responses`` (all rows), ``transport_error``, ``answered``, ``abstained``,
    ``unparseable``; answered with a confidence c: ``correct_at[c]`` / ``wrong_at[c]`` for
    c in 0..100; answered without: ``correct_noconf`` / ``wrong_noconf``; gradeable rows graded
    for hallucination: ``hallucinated`` / ``not_hallucinated``; gradeable rows of items expecting
    an abstention: ``expect_abstain`` (abstained: ``expect_abstain_abstained``); of valid items
    (neither expecting an abstention nor controls): ``valid`` / ``valid_abstained``; per class k
    of the true
    answer (answered rows only): ``answered_k[k]``, ``correct_k[k]``; per predicted class k:
    ``predicted_k[k]``.
    """

    n_classes: int
    responses: ClassVar[int] = _RESPONSES
    transport_error: ClassVar[int] = _TRANSPORT_ERROR
    answered: ClassVar[int] = _ANSWERED
    abstained: ClassVar[int] = _ABSTAINED
    unparseable: ClassVar[int] = _UNPARSEABLE
    correct_noconf: ClassVar[int] = _CORRECT_NOCONF
    wrong_noconf: ClassVar[int] = _WRONG_NOCONF
    hallucinated: ClassVar[int] = _HALLUCINATED
    not_hallucinated: ClassVar[int] = _NOT_HALLUCINATED
    expect_abstain: ClassVar[int] = _EXPECT_ABSTAIN
    expect_abstain_abstained: ClassVar[int] = _EXPECT_ABSTAIN_ABSTAINED
    valid: ClassVar[int] = _VALID
    valid_abstained: ClassVar[int] = _VALID_ABSTAINED

    @property
    def correct_at(self) -> slice:
        return slice(_CORRECT_AT, _CORRECT_AT + N_LEVELS)

    @property
    def wrong_at(self) -> slice:
        return slice(_WRONG_AT, _WRONG_AT + N_LEVELS)

    @property
    def answered_k(self) -> slice:
        return slice(_PER_CLASS, _PER_CLASS + self.n_classes)

    @property
    def correct_k(self) -> slice:
        return slice(_PER_CLASS + self.n_classes, _PER_CLASS + 2 * self.n_classes)

    @property
    def predicted_k(self) -> slice:
        return slice(_PER_CLASS + 2 * self.n_classes, _PER_CLASS + 3 * self.n_classes)

    @property
    def n_features(self) -> int:
        return _PER_CLASS + 3 * self.n_classes

    def feature_names(self) -> list[str]:
        """One name per feature, in layout order (for storing or debugging a table)."""
        names = ["n_responses", "n_transport_error", "n_answered", "n_abstained", "n_unparseable"]
        names += [f"correct_at_{c}" for c in range(N_LEVELS)]
        names += [f"wrong_at_{c}" for c in range(N_LEVELS)]
        names += ["n_correct_noconf", "n_wrong_noconf", "n_hallucinated", "n_not_hallucinated"]
        names += ["n_expect_abstain", "n_expect_abstain_abstained", "n_valid", "n_valid_abstained"]
        for block in ("answered_k", "correct_k", "predicted_k"):
            names += [f"{block}_{k}" for k in range(self.n_classes)]
        return names


@dataclass
class CountTable:
    """Per-subject feature counts: ``counts[s]`` sums the graded rows of ``subjects[s]``."""

    subjects: np.ndarray  # (S,) subject ids, sorted
    classes: np.ndarray  # (K,) class labels, sorted unless given
    counts: np.ndarray  # (S, F) float64
    layout: Layout

    @property
    def n_subjects(self) -> int:
        return int(self.subjects.shape[0])

    def totals(self) -> np.ndarray:
        """The (F,) feature sums over all subjects: the input for point estimates."""
        return self.counts.sum(axis=0)


def _bool_column(values: pd.Series) -> np.ndarray:
    return values.astype("boolean").fillna(False).to_numpy(dtype=bool)


def _factorize(values: pd.Series, sort: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(codes, distinct labels) of a string column; missing values read as ""."""
    codes, uniques = pd.factorize(values.fillna("").astype(str), sort=sort)
    return np.asarray(codes, dtype=np.int64), np.asarray(uniques, dtype=object)


def _class_lookup(uniques: np.ndarray, class_index: dict[str, int]) -> np.ndarray:
    """Class position of each distinct label; -1 for a label outside the classes, -2 for ""."""
    return np.array([-2 if u == "" else class_index.get(u, -1) for u in uniques], dtype=np.int64)


def _require_known(
    lookup: np.ndarray, uniques: np.ndarray, used: np.ndarray, allow_empty: bool
) -> None:
    if not allow_empty and np.any(lookup[used] == -2):
        raise ValueError("an answered row has no true_class")
    bad = lookup[used] == -1
    if np.any(bad):
        labels = sorted({str(uniques[c]) for c in np.unique(used[bad])})[:5]
        raise ValueError(f"classes {labels} are not in the given classes")


def _optional_features(
    rows: pd.DataFrame, outcome_feature: np.ndarray
) -> list[tuple[int, np.ndarray]]:
    """(feature, row mask) for the blocks read from the optional columns."""
    n = len(rows)
    flags = {
        name: _bool_column(rows[name]) if name in rows.columns else np.zeros(n, dtype=bool)
        for name in ("expect_abstain", "is_control")
    }
    if "hallucinated" in rows.columns:
        raw = pd.to_numeric(rows["hallucinated"], errors="coerce").to_numpy(
            dtype=np.float64, na_value=np.nan
        )
        hallucinated = np.where(np.isnan(raw), -1, raw)
        if np.any(~np.isin(hallucinated, (-1, 0, 1))):
            raise ValueError("hallucinated must be 1, 0 or -1 (not graded)")
    else:
        hallucinated = np.full(n, -1.0)
    gradeable = outcome_feature != _TRANSPORT_ERROR
    abstained = outcome_feature == _ABSTAINED
    expect = flags["expect_abstain"] & gradeable
    valid = ~flags["expect_abstain"] & ~flags["is_control"] & gradeable
    return [
        (_HALLUCINATED, gradeable & (hallucinated == 1)),
        (_NOT_HALLUCINATED, gradeable & (hallucinated == 0)),
        (_EXPECT_ABSTAIN, expect),
        (_EXPECT_ABSTAIN_ABSTAINED, expect & abstained),
        (_VALID, valid),
        (_VALID_ABSTAINED, valid & abstained),
    ]


def build_count_table(rows: pd.DataFrame, classes: Sequence[str] | None = None) -> CountTable:
    """Reduce graded rows to one count vector per subject.

    ``rows`` has the columns of ``REQUIRED_COLUMNS``: ``subject_id`` (str), ``outcome`` (an
    ``Outcome`` value), ``correct`` (bool, read only for answered rows), ``confidence`` (int
    0..100, or -1 / NaN when missing; read only for answered rows), ``true_class`` (the correct
    option's label) and ``pred_class`` (the chosen option's label, "" when not answered).
    Optional (``OPTIONAL_COLUMNS``, defaulted when absent or missing): ``hallucinated`` (1, 0,
    or -1 when not graded for hallucination), ``expect_abstain`` and ``is_control`` (bool).

    ``classes`` fixes the class axis (and its order); by default it is the sorted union of the
    true classes of all rows and the predicted classes of answered rows. Raises ValueError for a
    missing column, an unknown outcome, an answered row whose confidence is not an integer in
    -1..100, or an answered row whose true or predicted class is not among ``classes`` (an
    answered row must have a true class; a missing predicted class is allowed and not counted).
    """
    missing = [c for c in REQUIRED_COLUMNS if c not in rows.columns]
    if missing:
        raise ValueError(f"graded rows lack columns {missing}")

    subject_idx, subjects = _factorize(rows["subject_id"], sort=True)

    outcome_codes, outcome_labels = _factorize(rows["outcome"])
    outcome_lookup = np.array([_OUTCOME_FEATURE.get(u, -1) for u in outcome_labels], np.int64)
    if np.any(outcome_lookup < 0):
        bad = sorted(str(u) for u in outcome_labels[outcome_lookup < 0])[:5]
        raise ValueError(f"unknown outcomes {bad}; expected one of {sorted(_OUTCOME_FEATURE)}")
    outcome_feature = outcome_lookup[outcome_codes]
    answered = outcome_feature == _ANSWERED

    correct_a = _bool_column(rows["correct"])[answered]
    confidence = pd.to_numeric(rows["confidence"], errors="coerce").to_numpy(
        dtype=np.float64, na_value=np.nan
    )
    conf_a = confidence[answered]
    conf_a = np.where(np.isnan(conf_a), MISSING_CONFIDENCE, conf_a)
    if np.any(conf_a != np.round(conf_a)) or np.any((conf_a < -1) | (conf_a > 100)):
        raise ValueError("confidence must be an integer percent 0..100, or -1 when missing")
    conf_a = conf_a.astype(np.int64)

    true_codes, true_labels = _factorize(rows["true_class"])
    pred_codes, pred_labels = _factorize(rows["pred_class"])
    true_codes_a, pred_codes_a = true_codes[answered], pred_codes[answered]
    if classes is None:
        labels = set(true_labels) | set(pred_labels[np.unique(pred_codes_a)])
        class_labels = np.array(sorted(labels - {""}), dtype=object)
    else:
        class_labels = np.array([str(c) for c in classes], dtype=object)
        if len(set(class_labels)) != len(class_labels):
            raise ValueError("classes must be distinct")
    class_index = {label: k for k, label in enumerate(class_labels)}
    true_lookup = _class_lookup(true_labels, class_index)
    pred_lookup = _class_lookup(pred_labels, class_index)
    _require_known(true_lookup, true_labels, true_codes_a, allow_empty=False)
    _require_known(pred_lookup, pred_labels, pred_codes_a, allow_empty=True)
    true_k = true_lookup[true_codes_a]
    pred_k_all = pred_lookup[pred_codes_a]
    has_pred = pred_k_all >= 0
    pred_k = pred_k_all[has_pred]
    layout = Layout(n_classes=len(class_labels))

    has_conf = conf_a >= 0
    level_feature = np.where(correct_a, _CORRECT_AT, _WRONG_AT) + np.where(has_conf, conf_a, 0)
    noconf_feature = np.where(correct_a, _CORRECT_NOCONF, _WRONG_NOCONF)
    confidence_feature = np.where(has_conf, level_feature, noconf_feature)

    sub_a = subject_idx[answered]
    feature_parts = [
        np.full(len(rows), _RESPONSES, dtype=np.int64),
        outcome_feature,
        confidence_feature,
        layout.answered_k.start + true_k,
        layout.correct_k.start + true_k[correct_a],
        layout.predicted_k.start + pred_k,
    ]
    subject_parts = [
        subject_idx,
        subject_idx,
        sub_a,
        sub_a,
        sub_a[correct_a],
        sub_a[has_pred],
    ]
    for feature, mask in _optional_features(rows, outcome_feature):
        feature_parts.append(np.full(int(mask.sum()), feature, dtype=np.int64))
        subject_parts.append(subject_idx[mask])
    n_subjects, n_features = len(subjects), layout.n_features
    flat = np.concatenate(subject_parts) * n_features + np.concatenate(feature_parts)
    counts = np.bincount(flat, minlength=n_subjects * n_features).astype(np.float64)
    return CountTable(
        subjects=subjects,
        classes=class_labels,
        counts=counts.reshape(n_subjects, n_features),
        layout=layout,
    )


# ---------------------------------------------------------------------------------------------
# Metrics from summed counts

_LEVELS = np.arange(N_LEVELS, dtype=np.float64)  # integer percent as float64 (exact)
_BIN_OF_LEVEL = np.minimum(np.arange(N_LEVELS) // (100 // N_BINS), N_BINS - 1)
for _array in (_LEVELS, _BIN_OF_LEVEL):
    _array.setflags(write=False)


def _bin_sums(per_level: np.ndarray) -> np.ndarray:
    """(..., 101) per-level sums -> (..., 10) per-bin sums: levels 10b..10b+9, and 100 in bin 9.

    A reshape and a sum rather than a product with a (101, 10) 0/1 matrix: such small products
    go through BLAS, whose threads cost more to wake than the arithmetic (tens of ms per call on
    a busy machine); on integer counts both are exact.
    """
    width = N_LEVELS // N_BINS
    out = per_level[..., : N_BINS * width].reshape(*per_level.shape[:-1], N_BINS, width).sum(-1)
    out[..., -1] += per_level[..., N_BINS * width :].sum(axis=-1)
    return out


def _bin_sums_of(per_level: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """(B, 10) per-bin sums of (B, L) sums at the given (sorted) levels, without BLAS."""
    out = np.zeros((per_level.shape[0], N_BINS))
    if levels.size:
        bins = _BIN_OF_LEVEL[levels]
        starts = np.flatnonzero(np.r_[True, bins[1:] != bins[:-1]])
        out[:, bins[starts]] = np.add.reduceat(per_level, starts, axis=1)
    return out


def _dot(per_level: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``per_level @ weights`` without BLAS (see ``_bin_sums``)."""
    return (per_level * weights).sum(axis=-1)


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator, NaN where the denominator is 0 (never a warning)."""
    out = np.full(np.broadcast(numerator, denominator).shape, np.nan)
    np.divide(numerator, denominator, out=out, where=denominator > 0)
    return out


def _macro_f1(correct_k: np.ndarray, answered_k: np.ndarray, predicted_k: np.ndarray) -> np.ndarray:
    """Mean F1 = 2 TP / (support + predicted) over classes that are true or predicted."""
    seen = answered_k + predicted_k
    f1 = np.divide(2.0 * correct_k, seen, out=np.zeros_like(seen), where=seen > 0)
    return _ratio(f1.sum(axis=1), (seen > 0).sum(axis=1).astype(np.float64))


def _binned_calibration(
    correct_bin: np.ndarray, pct_sum_bin: np.ndarray, n_bin: np.ndarray, n_conf: np.ndarray
) -> dict[str, np.ndarray]:
    """MCE, debiased (l2) ECE and overconfidence error from the ten bins' sums."""
    filled = n_bin > 0
    acc = np.divide(correct_bin, n_bin, out=np.zeros_like(n_bin), where=filled)
    conf = np.divide(pct_sum_bin, 100.0 * n_bin, out=np.zeros_like(n_bin), where=filled)
    gap = np.abs(acc - conf)
    mce = np.where(filled, gap, -1.0).max(axis=1)
    # Kumar et al. (2019): subtract each bin's sampling variance of its accuracy.
    several = n_bin >= 2
    variance = np.divide(acc * (1.0 - acc), n_bin - 1.0, out=np.zeros_like(n_bin), where=several)
    squared = np.where(several, (acc - conf) ** 2 - variance, 0.0)
    debiased_sq = _ratio((n_bin * squared).sum(axis=1), n_conf)
    overconfidence = (n_bin * conf * np.maximum(conf - acc, 0.0)).sum(axis=1)
    return {
        "ece_debiased": np.sqrt(np.maximum(debiased_sq, 0.0), where=~np.isnan(debiased_sq),
                                out=np.full_like(debiased_sq, np.nan)),
        "mce": np.where(mce >= 0.0, mce, np.nan),
        "overconfidence_error": _ratio(overconfidence, n_conf),
    }  # fmt: skip


def _murphy(
    correct_at: np.ndarray, at_level: np.ndarray, levels: np.ndarray, n_conf: np.ndarray
) -> dict[str, Any]:
    """Murphy's decomposition of the Brier score with the 101 levels as forecast bins.

    reliability = sum_c n_c (c/100 - o_c/n_c)^2 / N, resolution = sum_c n_c (o_c/n_c - o)^2 / N,
    uncertainty = o (1 - o), with o = sum_c o_c / N; reliability - resolution + uncertainty is
    the Brier score, since each bin holds a single forecast value.
    """
    filled = at_level > 0
    n_correct = correct_at.sum(axis=1)
    safe = np.where(filled, at_level, 1.0)
    gap_rel = levels * at_level - 100.0 * correct_at  # n_c (c - 100 o_c/n_c)
    rel = np.where(filled, gap_rel**2 / safe, 0.0).sum(axis=1)
    gap_res = n_conf[:, None] * correct_at - n_correct[:, None] * at_level  # N n_c (o_c/n_c - o)
    res = np.where(filled, gap_res**2 / safe, 0.0).sum(axis=1)
    return {
        "brier_reliability": _ratio(rel, 10000.0 * n_conf),
        "brier_resolution": _ratio(res, n_conf**3),
        "brier_uncertainty": _ratio(n_correct * (n_conf - n_correct), n_conf**2),
    }


def _harmonic(n: np.ndarray) -> np.ndarray:
    """The harmonic number H(n) = 1 + 1/2 + ... + 1/n for counts n >= 0, through digamma."""
    return np.asarray(digamma(n + 1.0)) + np.euler_gamma


def _ranking(correct_at: np.ndarray, wrong_at: np.ndarray) -> dict[str, np.ndarray]:
    """AUROC, AURC, E-AURC and selective accuracy, from answers counted per confidence level.

    Levels ascend along axis 1; what lies above level j (the more confident answers) comes from
    the ascending cumulative sums, so no reversed copies are needed.
    """
    at_level = correct_at + wrong_at
    cum_at = np.cumsum(at_level, axis=1)  # answers at level j or below
    cum_wrong = np.cumsum(wrong_at, axis=1)
    n = cum_at[:, -1] if cum_at.shape[1] else np.zeros(len(at_level))
    n_wrong = cum_wrong[:, -1] if cum_wrong.shape[1] else np.zeros(len(at_level))
    n_correct = n - n_wrong
    # AUROC: each right answer beats the wrong ones below its level and ties half of its own.
    wrong_below = cum_wrong - 0.5 * wrong_at
    auroc = _ratio((correct_at * wrong_below).sum(axis=1), n_correct * n_wrong)
    # From the most confident down: A answers (W wrong) come before level j's m (w wrong).
    above = n[:, None] - cum_at
    wrong_above = n_wrong[:, None] - cum_wrong
    # Expected sum over j = 1..m of (W + j w / m) / (A + j), tied answers in random order:
    # w + (W - A w / m) (H(A + m) - H(A)). One digamma call: A + m at level j is A at j - 1.
    harmonic = _harmonic(np.concatenate([n[:, None], above], axis=1))
    filled = at_level > 0
    share = np.divide(wrong_at, at_level, out=np.zeros_like(at_level), where=filled)
    inner = wrong_at + (wrong_above - above * share) * (harmonic[:, :-1] - harmonic[:, 1:])
    aurc = _ratio(np.where(filled, inner, 0.0).sum(axis=1), n)
    # A perfect ranking puts every right answer first: (1/N) sum_{k > C} (k - C) / k.
    optimal = _ratio(n_wrong - n_correct * (_harmonic(n) - _harmonic(n_correct)), n)
    # Selective accuracy: keep the most confident answers up to SELECTIVE_COVERAGE of them.
    keep = SELECTIVE_COVERAGE * n
    take = np.minimum(np.maximum(keep[:, None] - above, 0.0), at_level)
    kept_correct = np.divide(take * correct_at, at_level, out=np.zeros_like(take), where=filled)
    return {
        "auroc": auroc,
        "aurc": aurc,
        "e_aurc": aurc - optimal,
        "selective_accuracy_80": _ratio(kept_correct.sum(axis=1), keep),
    }


def risk_coverage_curve(totals: np.ndarray, layout: Layout) -> pd.DataFrame:
    """The risk-coverage curve: one row per stated level, from the most confident down.

    Columns: ``threshold_pct`` (answers stating at least this are kept), ``coverage`` (share of
    answers with a confidence that are kept), ``risk`` (share of the kept that are wrong).
    Levels nobody stated are left out.
    """
    totals = np.asarray(totals, dtype=np.float64)
    if totals.shape != (layout.n_features,):
        raise ValueError(f"totals must have shape ({layout.n_features},)")
    correct = totals[layout.correct_at][::-1]
    wrong = totals[layout.wrong_at][::-1]
    kept = np.cumsum(correct + wrong)
    levels = np.arange(N_LEVELS - 1, -1, -1)
    filled = (correct + wrong) > 0
    return pd.DataFrame(
        {
            "threshold_pct": levels[filled],
            "coverage": _ratio(kept, np.full_like(kept, kept[-1]))[filled],
            "risk": _ratio(np.cumsum(wrong), kept)[filled],
        }
    )


def compute_metrics(totals: np.ndarray, layout: Layout) -> dict[str, Any]:
    """Every metric of ``METRIC_NAMES`` from summed counts.

    ``totals`` is one summed feature vector (F,) or a batch (B, F), e.g. B bootstrap resamples.
    Returns each metric as a numpy float64 scalar for (F,) input or a (B,) array for (B, F).
    Confidence-based metrics are fractions (c / 100). A metric whose denominator is 0 is NaN.
    """
    totals = np.asarray(totals, dtype=np.float64)
    single = totals.ndim == 1
    x = np.atleast_2d(totals)
    if x.ndim != 2 or x.shape[1] != layout.n_features:
        raise ValueError(f"totals must have shape (F,) or (B, F) with F={layout.n_features}")

    responses = x[:, layout.responses]
    transport = x[:, layout.transport_error]
    answered = x[:, layout.answered]
    gradeable = responses - transport
    # The per-level blocks, cut to the levels stated somewhere in the batch (a VLM states a
    # dozen of the 101): empty levels add nothing, and skipping them makes bootstrap batches
    # several times faster. Sums of integer counts are exact either way; the per-level ratios
    # summed by Murphy's decomposition and AURC may differ between batchings in the last bit.
    used = np.flatnonzero(x[:, layout.correct_at].any(axis=0) | x[:, layout.wrong_at].any(axis=0))
    levels = _LEVELS[used]
    correct_at = x[:, layout.correct_at.start + used]
    wrong_at = x[:, layout.wrong_at.start + used]
    at_level = correct_at + wrong_at
    n_conf = at_level.sum(axis=1)
    n_wrong_conf = wrong_at.sum(axis=1)
    noconf = x[:, layout.correct_noconf] + x[:, layout.wrong_noconf]
    n_correct = correct_at.sum(axis=1) + x[:, layout.correct_noconf]

    # ECE = sum_b (n_b / N) |acc_b - conf_b| = sum_b |100 * correct_b - pct_sum_b| / (100 N),
    # with integer sums per bin: no per-bin division and no float binning.
    correct_bin = _bin_sums_of(correct_at, used)
    pct_sum_bin = _bin_sums_of(at_level * levels, used)
    ece_num = np.abs(100.0 * correct_bin - pct_sum_bin).sum(axis=1)
    # Brier = mean (c/100 - y)^2 = sum [correct (100 - c)^2 + wrong c^2] / (10000 N).
    brier_num = _dot(correct_at, (100.0 - levels) ** 2) + _dot(wrong_at, levels**2)

    answered_k = x[:, layout.answered_k]
    correct_k = x[:, layout.correct_k]
    present = answered_k > 0
    recall_k = np.divide(correct_k, answered_k, out=np.zeros_like(correct_k), where=present)
    n_present = present.sum(axis=1)

    metrics = {
        "coverage": _ratio(answered, gradeable),
        "accuracy": _ratio(n_correct, answered),
        "balanced_accuracy": _ratio(recall_k.sum(axis=1), n_present.astype(np.float64)),
        "ece": _ratio(ece_num, 100.0 * n_conf),
        "brier": _ratio(brier_num, 10000.0 * n_conf),
        "conf_wrong": _ratio(_dot(wrong_at, levels), 100.0 * n_wrong_conf),
        "cw_rate": _ratio(wrong_at[:, levels >= CONFIDENTLY_WRONG_PCT].sum(axis=1), answered),
        "abstention_rate": _ratio(x[:, layout.abstained], gradeable),
        "unparseable_rate": _ratio(x[:, layout.unparseable], gradeable),
        "missing_conf_rate": _ratio(noconf, answered),
        "transport_error_rate": _ratio(transport, responses),
        "mean_confidence": _ratio(_dot(at_level, levels), 100.0 * n_conf),
        "macro_f1": _macro_f1(correct_k, answered_k, x[:, layout.predicted_k]),
        "ece_levels": _ratio(
            np.abs(100.0 * correct_at - at_level * levels).sum(axis=1), 100.0 * n_conf
        ),
        **_binned_calibration(correct_bin, pct_sum_bin, _bin_sums_of(at_level, used), n_conf),
        **_murphy(correct_at, at_level, levels, n_conf),
        **_ranking(correct_at, wrong_at),
        "hallucination_rate": _ratio(
            x[:, layout.hallucinated], x[:, layout.hallucinated] + x[:, layout.not_hallucinated]
        ),
        "abstention_appropriate": _ratio(
            x[:, layout.expect_abstain_abstained], x[:, layout.expect_abstain]
        ),
        "over_abstention": _ratio(x[:, layout.valid_abstained], x[:, layout.valid]),
    }
    if single:
        return {name: np.float64(value[0]) for name, value in metrics.items()}
    return metrics


def point_metrics(table: CountTable) -> dict[str, float]:
    """The point estimate of every metric over the whole table, as plain floats."""
    return {name: float(v) for name, v in compute_metrics(table.totals(), table.layout).items()}


class ReliabilityBin(NamedTuple):
    """One bin of a reliability diagram; the percent bounds are inclusive integers."""

    lower_pct: int
    upper_pct: int
    count: int  # type: ignore[assignment]  # shadows tuple.count; named as in the proto
    mean_conf: float  # mean c / 100 in the bin, NaN when empty
    accuracy: float  # fraction correct in the bin, NaN when empty


def reliability_bins(totals: np.ndarray, layout: Layout) -> list[ReliabilityBin]:
    """The 10 equal-width confidence bins over answered rows with a confidence.

    Bin b holds integer percents 10b..10b+9, except the top bin, which holds 90..100.
    """
    totals = np.asarray(totals, dtype=np.float64)
    if totals.shape != (layout.n_features,):
        raise ValueError(f"totals must have shape ({layout.n_features},)")
    correct_at = totals[layout.correct_at]
    at_level = correct_at + totals[layout.wrong_at]
    count = _bin_sums(at_level)
    mean_conf = _ratio(_bin_sums(at_level * _LEVELS), 100.0 * count)
    accuracy = _ratio(_bin_sums(correct_at), count)
    width = 100 // N_BINS
    return [
        ReliabilityBin(
            lower_pct=b * width,
            upper_pct=100 if b == N_BINS - 1 else b * width + width - 1,
            count=int(count[b]),
            mean_conf=float(mean_conf[b]),
            accuracy=float(accuracy[b]),
        )
        for b in range(N_BINS)
    ]
