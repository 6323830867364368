"""MedRCube's credibility analysis and the text-only drop. Pure: graded rows in, figures out.

Credibility (MedRCube, seeds/000): for every image that has both low-level items (modality, view,
protocol recognition) and high-level items (abnormality, disease, severity), each high-level item
is paired with each low-level item on the same image (``image_path``). A pair is in group

- A: both right; B: low right, high wrong; C: both wrong; D: low wrong, high right.

Luck rate = D / (A + D): of the high-level answers that were right, the share whose image the
model could not read at the low level. Shortcut probability = D / (C + D): of the pairs whose low
level was wrong, the share where the high level was right anyway. Rationality = 1 - luck rate.
"Right" means answered and correct; abstained and unparseable answers are not right. Transport
errors and ungraded rows are left out (the deployment's fault, not the model's). Intervals come
from a bootstrap over whole subjects (an image belongs to one subject).

Across models, the Pearson correlation of shortcut probability with high-level accuracy
(``scipy.stats.pearsonr``), reported with at least three models.

Text-only drop: a model's accuracy in a run with images minus its accuracy in a run that sent no
image, on the same benchmark, overall and per task, with a paired subject-bootstrap interval
(``grader.regressions.paired_differences``). A small drop means the questions can be answered
without looking at the image.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from grader.bootstrap import percentile_interval, subject_weights
from grader.figures import ALL
from grader.parsing import Outcome
from grader.regressions import paired_differences

LOW, HIGH = "low", "high"
MIN_MODELS = 3
_EXCLUDED = (Outcome.TRANSPORT_ERROR.value, "ungraded")
_NAN2 = (math.nan, math.nan)


@dataclass(frozen=True)
class Credibility:
    """One run's credibility figures. Ratios are NaN when their denominator is 0."""

    image_count: int  # images with both low- and high-level items
    pair_count: int
    a_count: int
    b_count: int
    c_count: int
    d_count: int
    luck_rate: float
    shortcut_probability: float
    rationality: float
    has_interval: bool
    luck_interval: tuple[float, float]
    shortcut_interval: tuple[float, float]
    rationality_interval: tuple[float, float]
    high_level_accuracy: float  # answered high-level items right (all high-level items)
    low_level_accuracy: float
    subject_count: int  # subjects with at least one pair
    too_few_subjects: bool


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    out = np.full(np.shape(num), np.nan)
    np.divide(num, den, out=out, where=den > 0)
    return out


def _accuracy(rows: pd.DataFrame) -> float:
    answered = rows["outcome"] == Outcome.ANSWERED.value
    n = int(answered.sum())
    return float(rows.loc[answered, "correct"].astype(bool).sum()) / n if n else math.nan


def credibility(
    rows: pd.DataFrame,
    *,
    n_resamples: int,
    seed: Sequence[int] | int,
    min_subjects: int,
) -> Credibility:
    """Groups A-D and the ratios for one run's graded rows (columns ``image_path``,
    ``hierarchy``, ``subject_id``, ``outcome``, ``correct``)."""
    usable = rows[~rows["outcome"].isin(_EXCLUDED)]
    usable = usable[usable["hierarchy"].isin((LOW, HIGH)) & (usable["image_path"] != "")]
    right = (usable["outcome"] == Outcome.ANSWERED.value) & usable["correct"].astype(bool)
    per = (
        pd.DataFrame(
            {
                "image_path": usable["image_path"].to_numpy(),
                "subject_id": usable["subject_id"].to_numpy(),
                "n_low": (usable["hierarchy"] == LOW).to_numpy(dtype=np.int64),
                "n_high": (usable["hierarchy"] == HIGH).to_numpy(dtype=np.int64),
                "r_low": ((usable["hierarchy"] == LOW) & right).to_numpy(dtype=np.int64),
                "r_high": ((usable["hierarchy"] == HIGH) & right).to_numpy(dtype=np.int64),
            }
        )
        .groupby(["subject_id", "image_path"], sort=True)
        .sum()
    )
    per = per[(per["n_low"] > 0) & (per["n_high"] > 0)]
    wl, wh = per["n_low"] - per["r_low"], per["n_high"] - per["r_high"]
    groups = pd.DataFrame(
        {
            "a": per["r_low"] * per["r_high"],
            "b": per["r_low"] * wh,
            "c": wl * wh,
            "d": wl * per["r_high"],
        }
    )
    by_subject = groups.groupby(level="subject_id", sort=True).sum()
    counts = by_subject.to_numpy(dtype=np.float64).reshape(-1, 4)
    a, b, c, d = counts.sum(axis=0) if len(counts) else np.zeros(4)

    def ratios(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return _ratio(x[..., 3], x[..., 0] + x[..., 3]), _ratio(x[..., 3], x[..., 2] + x[..., 3])

    n_subjects = counts.shape[0]
    too_few = n_subjects < min_subjects
    luck_i, shortcut_i, rational_i = _NAN2, _NAN2, _NAN2
    if n_resamples > 0 and not too_few:
        weights = subject_weights(n_subjects, n_resamples, np.random.default_rng(seed))
        luck_b, shortcut_b = ratios(weights @ counts)
        luck_i, shortcut_i = percentile_interval(luck_b), percentile_interval(shortcut_b)
        rational_i = percentile_interval(1.0 - luck_b)
    has = all(np.isfinite(v) for v in (*luck_i, *shortcut_i))
    luck, shortcut = (float(v) for v in ratios(np.array([a, b, c, d])))
    hier = rows[~rows["outcome"].isin(_EXCLUDED)]
    return Credibility(
        image_count=len(per),
        pair_count=int(a + b + c + d),
        a_count=int(a),
        b_count=int(b),
        c_count=int(c),
        d_count=int(d),
        luck_rate=luck,
        shortcut_probability=shortcut,
        rationality=1.0 - luck,
        has_interval=bool(has),
        luck_interval=luck_i if has else _NAN2,
        shortcut_interval=shortcut_i if has else _NAN2,
        rationality_interval=rational_i if has else _NAN2,
        high_level_accuracy=_accuracy(hier[hier["hierarchy"] == HIGH]),
        low_level_accuracy=_accuracy(hier[hier["hierarchy"] == LOW]),
        subject_count=n_subjects,
        too_few_subjects=too_few,
    )


@dataclass(frozen=True)
class Correlation:
    """Pearson's r of shortcut probability with high-level accuracy across models."""

    model_count: int  # models with both figures defined
    r: float
    p_value: float
    has_correlation: bool  # False with fewer than three models or a constant figure
    note: str


def shortcut_correlation(shortcut: Sequence[float], high_accuracy: Sequence[float]) -> Correlation:
    """Pearson correlation over models (one point per model, NaN points left out)."""
    x = np.asarray(shortcut, dtype=np.float64)
    y = np.asarray(high_accuracy, dtype=np.float64)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    n = int(keep.sum())
    if n < MIN_MODELS:
        return Correlation(n, math.nan, math.nan, False, f"needs at least {MIN_MODELS} models")
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return Correlation(n, math.nan, math.nan, False, "a figure is the same for every model")
    result = stats.pearsonr(x, y)
    return Correlation(n, float(result.statistic), float(result.pvalue), True, "")


@dataclass(frozen=True)
class TextOnlyDrop:
    """Accuracy with images minus accuracy without, for one task ("all" pools them)."""

    task: str
    image_accuracy: float
    text_accuracy: float
    drop: float
    has_interval: bool
    lower: float
    upper: float
    subject_count: int
    too_few_subjects: bool


def text_only_drop(
    image_rows: pd.DataFrame,
    text_rows: pd.DataFrame,
    *,
    n_resamples: int,
    seed: Sequence[int] | int,
    min_subjects: int,
) -> list[TextOnlyDrop]:
    """The drop overall and per task shared by both runs, with paired subject intervals."""
    image_rows = image_rows[image_rows["outcome"] != "ungraded"]
    text_rows = text_rows[text_rows["outcome"] != "ungraded"]
    if image_rows.empty or text_rows.empty:
        return []
    base_seed = list(seed) if isinstance(seed, Sequence) else [seed]
    out = []
    tasks = sorted(set(image_rows["task"]) & set(text_rows["task"]))
    for i, task in enumerate([ALL, *tasks]):
        img = image_rows if task == ALL else image_rows[image_rows["task"] == task]
        txt = text_rows if task == ALL else text_rows[text_rows["task"] == task]
        values, paired = paired_differences(
            txt, img, n_resamples=n_resamples, seed=[*base_seed, i], min_subjects=min_subjects
        )
        text_acc, image_acc, lo, hi = values["accuracy"]
        has = bool(np.isfinite(lo) and np.isfinite(hi))
        out.append(
            TextOnlyDrop(
                task=task, image_accuracy=image_acc, text_accuracy=text_acc,
                drop=image_acc - text_acc, has_interval=has, lower=lo if has else math.nan,
                upper=hi if has else math.nan, subject_count=paired,
                too_few_subjects=paired < min_subjects,
            )
        )  # fmt: skip
    return out
