"""A run's figures: every metric per (task, format) and per benchmark axis, with intervals.

Pure: graded rows in, tables out. Each group gets one count table; the point figures and the
subject-clustered bootstrap both come from it (DESIGN.md, "Measuring well").
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

import numpy as np
import pandas as pd

from grader.bootstrap import clustered_bootstrap
from grader.grading import GROUP_AXES
from grader.metrics import build_count_table, compute_metrics, reliability_bins
from grader.parsing import Outcome

ALL = "all"


def _groups(rows: pd.DataFrame) -> Iterator[tuple[str, str, str, str, pd.Series]]:
    tasks = sorted(rows["task"].unique())
    formats = sorted(rows["format"].unique())
    everything = pd.Series(True, index=rows.index)
    for task in [ALL, *tasks]:
        task_mask = everything if task == ALL else rows["task"] == task
        for fmt in [ALL, *formats]:
            mask = task_mask if fmt == ALL else task_mask & (rows["format"] == fmt)
            if mask.any():
                yield task, fmt, "", "", mask
    for axis in GROUP_AXES:
        for value in sorted(v for v in rows[axis].unique() if v):
            yield ALL, ALL, axis, value, rows[axis] == value


def _metric_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The columns the count table reads; classes are namespaced by task so pooling is safe."""
    return pd.DataFrame(
        {
            "subject_id": rows["subject_id"].to_numpy(),
            "outcome": rows["outcome"].to_numpy(),
            "correct": rows["correct"].to_numpy(dtype=bool),
            "confidence": rows["confidence"].to_numpy(dtype=np.int64),
            "true_class": (rows["task"] + ":" + rows["true_class"]).to_numpy(),
            "pred_class": np.where(
                rows["pred_class"] != "", rows["task"] + ":" + rows["pred_class"], ""
            ),
        }
    )


def group_seed(base: int, run_id: str, *parts: str) -> list[int]:
    """A deterministic bootstrap seed per run and group."""
    return [base, zlib.crc32("|".join((run_id, *parts)).encode())]


def compute_run_figures(
    rows: pd.DataFrame,
    run_id: str,
    model_name: str,
    *,
    final: bool,
    n_resamples: int,
    seed: int,
    min_subjects: int,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(metrics, reliability bins) for one run's graded rows."""
    rows = rows[rows["outcome"] != "ungraded"]
    metric_out: list[dict[str, object]] = []
    bin_out: list[dict[str, object]] = []
    if rows.empty:
        return pd.DataFrame(metric_out), pd.DataFrame(bin_out)
    for task, fmt, axis, value, mask in _groups(rows):
        sub = rows[mask]
        table = build_count_table(_metric_rows(sub))
        totals = table.counts.sum(axis=0)
        point = compute_metrics(totals, table.layout)
        n_subjects = int(sub["subject_id"].nunique())
        too_few = n_subjects < min_subjects
        intervals: dict[str, tuple[float, float]] = {}
        if final and n_resamples > 0 and not too_few:
            intervals = clustered_bootstrap(
                table,
                n_resamples=n_resamples,
                seed=group_seed(seed, run_id, task, fmt, axis, value),
            )
        for metric, val in point.items():
            lo, hi = intervals.get(metric, (float("nan"), float("nan")))
            has = bool(np.isfinite(lo) and np.isfinite(hi))
            metric_out.append(
                {
                    "run_id": run_id,
                    "model_name": model_name,
                    "task": task,
                    "format": fmt,
                    "group_axis": axis,
                    "group_value": value,
                    "metric": metric,
                    "value": float(val),
                    "has_interval": has,
                    "lower": float(lo) if has else None,
                    "upper": float(hi) if has else None,
                    "response_count": len(sub),
                    "subject_count": n_subjects,
                    "too_few_subjects": too_few,
                    "final": final,
                }
            )
        if not axis:
            for i, (lo_pct, hi_pct, count, mean_conf, acc) in enumerate(
                reliability_bins(totals, table.layout)
            ):
                bin_out.append(
                    {
                        "run_id": run_id,
                        "task": task,
                        "format": fmt,
                        "bin": i,
                        "lower_percent": int(lo_pct),
                        "upper_percent": int(hi_pct),
                        "count": int(count),
                        "mean_confidence": None if not np.isfinite(mean_conf) else float(mean_conf),
                        "accuracy": None if not np.isfinite(acc) else float(acc),
                    }
                )
    return pd.DataFrame(metric_out), pd.DataFrame(bin_out)


def run_alerts(
    rows: pd.DataFrame, run: dict[str, object], transport_error_alert_rate: float
) -> list[dict[str, object]]:
    """Alerts a finished run raises: a failed run, and too many transport errors."""
    alerts: list[dict[str, object]] = []
    run_id, model = str(run["run_id"]), str(run["model_name"])
    when = run.get("end_time") or run.get("start_time")
    if run.get("state") == "failed":
        alerts.append(
            {
                "alert_id": f"{run_id}:run_failed",
                "kind": "run_failed",
                "severity": "critical",
                "model_name": model,
                "run_id": run_id,
                "message": f"Run {run_id} of {model} failed before every item was answered.",
                "create_time": when,
            }
        )
    if len(rows):
        rate = float((rows["outcome"] == Outcome.TRANSPORT_ERROR.value).mean())
        if rate > transport_error_alert_rate:
            alerts.append(
                {
                    "alert_id": f"{run_id}:transport_errors",
                    "kind": "transport_errors",
                    "severity": "warning",
                    "model_name": model,
                    "run_id": run_id,
                    "message": (
                        f"{rate:.1%} of {model}'s requests in run {run_id} failed in transport"
                        f" or timed out (threshold {transport_error_alert_rate:.0%})."
                    ),
                    "create_time": when,
                }
            )
    return alerts
