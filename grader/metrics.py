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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import numpy as np
import pandas as pd

from grader.parsing import Outcome

N_LEVELS = 101  # stated confidence 0..100, integer percent
N_BINS = 10
CONFIDENTLY_WRONG_PCT = 80  # "confidently wrong": answered, wrong, confidence >= 0.8
MISSING_CONFIDENCE = -1

REQUIRED_COLUMNS = ("subject_id", "outcome", "correct", "confidence", "true_class", "pred_class")

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
_PER_CLASS = _WRONG_NOCONF + 1

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
    c in 0..100; answered without: ``correct_noconf`` / ``wrong_noconf``; per class k of the true
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
        names += ["n_correct_noconf", "n_wrong_noconf"]
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


def build_count_table(rows: pd.DataFrame, classes: Sequence[str] | None = None) -> CountTable:
    """Reduce graded rows to one count vector per subject.

    ``rows`` has the columns of ``REQUIRED_COLUMNS``: ``subject_id`` (str), ``outcome`` (an
    ``Outcome`` value), ``correct`` (bool, read only for answered rows), ``confidence`` (int
    0..100, or -1 / NaN when missing; read only for answered rows), ``true_class`` (the correct
    option's label) and ``pred_class`` (the chosen option's label, "" when not answered).

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
_BIN_MATRIX = np.zeros((N_LEVELS, N_BINS))
_BIN_MATRIX[np.arange(N_LEVELS), _BIN_OF_LEVEL] = 1.0
_CW_MASK = (_LEVELS >= CONFIDENTLY_WRONG_PCT).astype(np.float64)
for _array in (_LEVELS, _BIN_OF_LEVEL, _BIN_MATRIX, _CW_MASK):
    _array.setflags(write=False)


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator, NaN where the denominator is 0 (never a warning)."""
    out = np.full(np.broadcast(numerator, denominator).shape, np.nan)
    np.divide(numerator, denominator, out=out, where=denominator > 0)
    return out


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
    correct_at = x[:, layout.correct_at]
    wrong_at = x[:, layout.wrong_at]
    at_level = correct_at + wrong_at
    n_conf = at_level.sum(axis=1)
    n_wrong_conf = wrong_at.sum(axis=1)
    noconf = x[:, layout.correct_noconf] + x[:, layout.wrong_noconf]
    n_correct = correct_at.sum(axis=1) + x[:, layout.correct_noconf]

    # ECE = sum_b (n_b / N) |acc_b - conf_b| = sum_b |100 * correct_b - pct_sum_b| / (100 N),
    # with integer sums per bin: no per-bin division and no float binning.
    correct_bin = correct_at @ _BIN_MATRIX
    pct_sum_bin = (at_level * _LEVELS) @ _BIN_MATRIX
    ece_num = np.abs(100.0 * correct_bin - pct_sum_bin).sum(axis=1)
    # Brier = mean (c/100 - y)^2 = sum [correct (100 - c)^2 + wrong c^2] / (10000 N).
    brier_num = correct_at @ (100.0 - _LEVELS) ** 2 + wrong_at @ _LEVELS**2

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
        "conf_wrong": _ratio(wrong_at @ _LEVELS, 100.0 * n_wrong_conf),
        "cw_rate": _ratio(wrong_at @ _CW_MASK, answered),
        "abstention_rate": _ratio(x[:, layout.abstained], gradeable),
        "unparseable_rate": _ratio(x[:, layout.unparseable], gradeable),
        "missing_conf_rate": _ratio(noconf, answered),
        "transport_error_rate": _ratio(transport, responses),
        "mean_confidence": _ratio(at_level @ _LEVELS, 100.0 * n_conf),
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
    count = at_level @ _BIN_MATRIX
    mean_conf = _ratio((at_level * _LEVELS) @ _BIN_MATRIX, 100.0 * count)
    accuracy = _ratio(correct_at @ _BIN_MATRIX, count)
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
