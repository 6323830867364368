"""Regressions between two runs on the same items. Pure: graded rows in, comparisons out.

For two runs on the same benchmark (the same content hash), every metric is compared as the
paired difference ``new - base`` with a PAIRED subject-clustered bootstrap interval: each resample
draws subjects with replacement once and applies the same subject weights to both runs' count
tables, so the subject-to-subject variation common to both runs cancels (DESIGN.md, "Measuring
well"). Accuracy also gets a clustered McNemar test on the items answered in both runs.

Clustered McNemar: the statistic of Durkalski, Palesch, Lipsitz and Rust (2003), "Analysis of
clustered matched-pair data", Statistics in Medicine 22(15):2417-2428, with subjects as the
clusters. With ``b_k`` the items of subject k right in the base run and wrong in the new one and
``c_k`` the reverse, ``X2 = (sum_k (b_k - c_k))**2 / sum_k (b_k - c_k)**2``, referred to a
chi-square with one degree of freedom. It reduces to the ordinary McNemar statistic when each
subject has one item, and stays valid when a subject's items are correlated (Obuchowski 1998,
Statistics in Medicine 17:1495-1507, is the related variance-based test).

An alert is raised for a metric when its interval excludes zero in the bad direction AND the
change exceeds the metric's margin; cells with fewer subjects than the minimum get no interval and
never alert (and say so).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
import pandas as pd
from scipy import stats

from grader.bootstrap import percentile_interval, subject_weights
from grader.figures import ALL, group_seed, metric_rows
from grader.metrics import build_count_table, compute_metrics
from grader.parsing import Outcome

# Which way is better for each metric with a direction (+1 higher, -1 lower). Metrics without
# one (abstention rate, transport-error rate, mean confidence, Brier uncertainty) are compared
# but never alert: a change there is not good or bad by itself.
DIRECTION: dict[str, int] = {
    **dict.fromkeys(
        ("coverage", "accuracy", "balanced_accuracy", "macro_f1", "auroc",
         "selective_accuracy_80", "abstention_appropriate", "brier_resolution"), 1),
    **dict.fromkeys(
        ("ece", "ece_levels", "ece_debiased", "mce", "brier", "brier_reliability", "conf_wrong",
         "cw_rate", "aurc", "e_aurc", "overconfidence_error", "hallucination_rate",
         "over_abstention", "unparseable_rate", "missing_conf_rate"), -1),
}  # fmt: skip

# The metrics that raise regression alerts by default (the headline figures).
ALERT_METRICS: tuple[str, ...] = (
    "accuracy", "balanced_accuracy", "coverage", "ece", "brier", "conf_wrong", "cw_rate",
    "macro_f1", "auroc", "hallucination_rate",
)  # fmt: skip

MCNEMAR_METHOD = "clustered McNemar, Durkalski et al. (2003), subjects as clusters"


@dataclass(frozen=True)
class McNemar:
    """The clustered McNemar test for accuracy on the items answered in both runs."""

    statistic: float  # 0 when there is no discordant pair
    p_value: float  # 1 when there is no discordant pair
    base_only_count: int  # items right in the base run only
    new_only_count: int  # items right in the new run only
    pair_count: int  # items answered in both runs
    cluster_count: int  # subjects with at least one such item
    method: str = MCNEMAR_METHOD


@dataclass(frozen=True)
class Difference:
    """One metric of one task, base run against new run."""

    task: str
    metric: str
    base_value: float
    value: float
    difference: float  # value - base_value
    has_interval: bool
    lower: float
    upper: float
    direction: int  # +1 higher is better, -1 lower is better, 0 neither
    margin: float
    regressed: bool
    subject_count: int  # subjects with responses in both runs, in this task
    too_few_subjects: bool
    mcnemar: McNemar | None = None


@dataclass(frozen=True)
class Comparison:
    """Every metric difference between two runs on the same items."""

    base_run_id: str
    run_id: str
    subject_count: int  # subjects with responses in both runs
    too_few_subjects: bool
    differences: list[Difference] = field(default_factory=list)

    def regressions(self) -> list[Difference]:
        return [d for d in self.differences if d.regressed]


def _paired_tables(
    base: pd.DataFrame, new: pd.DataFrame
) -> tuple[np.ndarray, np.ndarray, object, int]:
    """Both runs' count tables on one subject axis and one layout, and the paired subject count."""
    mb, mn = metric_rows(base), metric_rows(new)
    subjects = sorted(set(mb["subject_id"]) | set(mn["subject_id"]))
    both = pd.concat(
        [
            mb.assign(subject_id="0|" + mb["subject_id"]),
            mn.assign(subject_id="1|" + mn["subject_id"]),
        ],
        ignore_index=True,
    )
    table = build_count_table(both)
    index = {s: i for i, s in enumerate(subjects)}
    a = np.zeros((len(subjects), table.layout.n_features))
    b = np.zeros_like(a)
    for k, sid in enumerate(table.subjects):
        side, subject = str(sid).split("|", 1)
        (a if side == "0" else b)[index[subject]] = table.counts[k]
    paired = len(set(mb["subject_id"]) & set(mn["subject_id"]))
    return a, b, table.layout, paired


def paired_differences(
    base: pd.DataFrame,
    new: pd.DataFrame,
    *,
    n_resamples: int,
    seed: Sequence[int] | int,
    min_subjects: int,
) -> tuple[dict[str, tuple[float, float, float, float]], int]:
    """metric -> (base value, new value, lower, upper of new - base); and the paired subjects.

    The interval is NaN when there are too few paired subjects or no resamples.
    """
    a, b, layout, paired = _paired_tables(base, new)
    point_a = compute_metrics(a.sum(axis=0), layout)  # type: ignore[arg-type]
    point_b = compute_metrics(b.sum(axis=0), layout)  # type: ignore[arg-type]
    intervals: dict[str, tuple[float, float]] = {}
    if n_resamples > 0 and paired >= min_subjects:
        weights = subject_weights(a.shape[0], n_resamples, np.random.default_rng(seed))
        res_a = compute_metrics(weights @ a, layout)  # type: ignore[arg-type]
        res_b = compute_metrics(weights @ b, layout)  # type: ignore[arg-type]
        intervals = {m: percentile_interval(res_b[m] - res_a[m]) for m in point_a}
    nan = (math.nan, math.nan)
    return {
        m: (float(point_a[m]), float(point_b[m]), *intervals.get(m, nan)) for m in point_a
    }, paired


def _right(rows: pd.DataFrame) -> pd.Series:
    return (rows["outcome"] == Outcome.ANSWERED.value) & rows["correct"].astype(bool)


def clustered_mcnemar(base: pd.DataFrame, new: pd.DataFrame) -> McNemar:
    """Durkalski's clustered McNemar test on the items (by ``item_id``) answered in both runs."""
    answered = Outcome.ANSWERED.value
    b = base[base["outcome"] == answered]
    n = new[new["outcome"] == answered]
    pairs = pd.DataFrame(
        {"item_id": b["item_id"].to_numpy(), "subject_id": b["subject_id"].to_numpy(),
         "right_base": _right(b).to_numpy()}
    ).merge(
        pd.DataFrame({"item_id": n["item_id"].to_numpy(), "right_new": _right(n).to_numpy()}),
        on="item_id",
    )  # fmt: skip
    base_only = (pairs["right_base"] & ~pairs["right_new"]).astype(np.int64)
    new_only = (~pairs["right_base"] & pairs["right_new"]).astype(np.int64)
    per = (base_only - new_only).groupby(pairs["subject_id"]).sum()
    denominator = float((per.astype(np.float64) ** 2).sum())
    if denominator == 0.0:
        statistic, p_value = 0.0, 1.0
    else:
        statistic = float(per.sum()) ** 2 / denominator
        p_value = float(stats.chi2.sf(statistic, 1))
    return McNemar(
        statistic=statistic,
        p_value=p_value,
        base_only_count=int(base_only.sum()),
        new_only_count=int(new_only.sum()),
        pair_count=len(pairs),
        cluster_count=int(pairs["subject_id"].nunique()),
    )


def _gradeable(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[rows["outcome"] != "ungraded"]


def compare_runs(
    base: pd.DataFrame,
    new: pd.DataFrame,
    base_run_id: str,
    run_id: str,
    *,
    n_resamples: int,
    seed: int,
    min_subjects: int,
    margins: Mapping[str, float] | None = None,
    default_margin: float = 0.05,
    alert_metrics: Sequence[str] = ALERT_METRICS,
) -> Comparison:
    """Every metric of ``new`` against ``base``, pooled over tasks ("all") and per task."""
    base, new = _gradeable(base), _gradeable(new)
    margins = margins or {}
    differences: list[Difference] = []
    pooled_paired = 0
    if base.empty or new.empty:
        return Comparison(base_run_id, run_id, 0, True, [])
    tasks = sorted(set(base["task"]) & set(new["task"]))
    for task in [ALL, *tasks]:
        b = base if task == ALL else base[base["task"] == task]
        n = new if task == ALL else new[new["task"] == task]
        values, paired = paired_differences(
            b, n,
            n_resamples=n_resamples,
            seed=group_seed(seed, run_id, "regression", base_run_id, task),
            min_subjects=min_subjects,
        )  # fmt: skip
        if task == ALL:
            pooled_paired = paired
        too_few = paired < min_subjects
        test = clustered_mcnemar(b, n)
        for metric, (bv, nv, lo, hi) in values.items():
            direction = DIRECTION.get(metric, 0)
            margin = float(margins.get(metric, default_margin))
            has = bool(np.isfinite(lo) and np.isfinite(hi))
            diff = nv - bv
            bad_side = (hi < 0.0) if direction > 0 else (lo > 0.0) if direction < 0 else False
            regressed = bool(
                has and not too_few and metric in alert_metrics and direction != 0
                and bad_side and abs(diff) > margin
            )  # fmt: skip
            differences.append(
                Difference(
                    task=task, metric=metric, base_value=bv, value=nv, difference=diff,
                    has_interval=has, lower=lo if has else math.nan,
                    upper=hi if has else math.nan, direction=direction, margin=margin,
                    regressed=regressed, subject_count=paired, too_few_subjects=too_few,
                    mcnemar=test if metric == "accuracy" else None,
                )
            )  # fmt: skip
    return Comparison(base_run_id, run_id, pooled_paired, pooled_paired < min_subjects, differences)


def regression_alerts(
    comparison: Comparison, model_name: str, when: datetime | None
) -> list[dict[str, object]]:
    """One stored alert per regressed metric and task; ids and times are deterministic."""
    alerts: list[dict[str, object]] = []
    for d in comparison.regressions():
        where = "all tasks" if d.task == ALL else f"task {d.task}"
        verb = "fell" if d.difference < 0 else "rose"
        alerts.append(
            {
                "alert_id": f"{comparison.run_id}:regression:{d.task}:{d.metric}",
                "kind": "regression",
                "severity": "warning",
                "model_name": model_name,
                "run_id": comparison.run_id,
                "message": (
                    f"{d.metric} of {model_name} ({where}) {verb} from {d.base_value:.3f} in run"
                    f" {comparison.base_run_id} to {d.value:.3f} in run {comparison.run_id}"
                    f" ({d.difference:+.3f}, 95% paired interval {d.lower:+.3f} to"
                    f" {d.upper:+.3f}; margin {d.margin:.3f})."
                ),
                "create_time": when,
            }
        )
    return alerts


def comparison_frame(comparison: Comparison, model_name: str) -> pd.DataFrame:
    """A comparison as rows of the store's ``regressions`` table."""
    rows = []
    for d in comparison.differences:
        m = d.mcnemar
        rows.append(
            {
                "run_id": comparison.run_id, "base_run_id": comparison.base_run_id,
                "model_name": model_name, "task": d.task, "metric": d.metric,
                "base_value": d.base_value, "value": d.value, "difference": d.difference,
                "direction": d.direction, "has_interval": d.has_interval,
                "lower": d.lower if d.has_interval else None,
                "upper": d.upper if d.has_interval else None,
                "margin": d.margin, "regressed": d.regressed,
                "subject_count": d.subject_count,
                "too_few_subjects": d.too_few_subjects,
                "mcnemar_statistic": m.statistic if m else None,
                "mcnemar_p_value": m.p_value if m else None,
                "mcnemar_base_only_count": m.base_only_count if m else None,
                "mcnemar_new_only_count": m.new_only_count if m else None,
                "mcnemar_pair_count": m.pair_count if m else None,
                "mcnemar_cluster_count": m.cluster_count if m else None,
            }
        )  # fmt: skip
    return pd.DataFrame(rows)
