"""Pure display logic for the dashboard: formatting figures and pivoting tables. No I/O.

The input frames are the ones ``dashboard.client`` returns; the outputs are what the Streamlit
page shows. Keeping this apart from ``app.py`` makes it testable without a browser or a server.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

NO_INTERVAL = "—"
"""Marks a figure whose group has too few subjects for an interval."""
NOT_AVAILABLE = "n/a"
"""A figure that is undefined for the group (for example accuracy with nothing answered)."""


@dataclass(frozen=True)
class MetricInfo:
    """One headline metric: its key in the grader's figures, a label and a plain explanation."""

    key: str
    label: str
    meaning: str
    lower_is_better: bool


METRICS: tuple[MetricInfo, ...] = (
    MetricInfo("coverage", "Coverage",
               "share of questions the model answered (not abstained, unparseable or failed)",
               lower_is_better=False),
    MetricInfo("accuracy", "Accuracy", "share of answered questions answered correctly",
               lower_is_better=False),
    MetricInfo("balanced_accuracy", "Balanced accuracy",
               "accuracy averaged over the true answers, so always giving the commonest answer "
               "does not look good", lower_is_better=False),
    MetricInfo("ece", "ECE",
               "expected calibration error: the gap between stated confidence and actual "
               "accuracy, averaged over ten confidence bins (0 is perfectly calibrated)",
               lower_is_better=True),
    MetricInfo("brier", "Brier",
               "mean squared gap between stated confidence and whether the answer was right",
               lower_is_better=True),
    MetricInfo("conf_wrong", "Confidence when wrong",
               "mean stated confidence on wrong answers", lower_is_better=True),
    MetricInfo("cw_rate", "Confidently wrong",
               "share of answered questions that were wrong with a stated confidence of 80% or "
               "more", lower_is_better=True),
)  # fmt: skip
METRIC_KEYS: tuple[str, ...] = tuple(m.key for m in METRICS)
METRIC_LABELS: dict[str, str] = {m.key: m.label for m in METRICS}


def metric_label(key: str) -> str:
    return METRIC_LABELS.get(key, key.replace("_", " "))


def metric_caption() -> str:
    """One plain-language line per headline metric, as Markdown."""
    return "  \n".join(
        f"**{m.label}**: {m.meaning}{' (lower is better)' if m.lower_is_better else ''}."
        for m in METRICS
    )


def _missing(value: object) -> bool:
    if value is None or value is pd.NaT:
        return True
    try:
        return math.isnan(float(value))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


def format_value(value: object, digits: int = 3) -> str:
    """``0.612``; undefined values as ``n/a``."""
    if _missing(value):
        return NOT_AVAILABLE
    return f"{float(value):.{digits}f}"  # type: ignore[arg-type]


def format_figure(
    value: object,
    lower: object = None,
    upper: object = None,
    *,
    has_interval: bool = False,
    too_few_subjects: bool = False,
) -> str:
    """A figure as a table cell: ``0.612 [0.55, 0.67]`` with its 95% interval when there is one,
    ``0.612 [—]`` when the group has too few subjects for one, plain ``0.612`` otherwise (a run
    still in progress has no intervals yet), ``n/a`` when the figure is undefined."""
    if _missing(value):
        return NOT_AVAILABLE
    text = format_value(value)
    if has_interval and not _missing(lower) and not _missing(upper):
        return f"{text} [{float(lower):.2f}, {float(upper):.2f}]"  # type: ignore[arg-type]
    if too_few_subjects:
        return f"{text} [{NO_INTERVAL}]"
    return text


def format_time(value: object) -> str:
    """A UTC timestamp to the minute, or empty."""
    if _missing(value):
        return ""
    ts = pd.Timestamp(value)  # type: ignore[arg-type]
    if ts.tzinfo is not None:
        ts = ts.tz_convert("UTC")
    return ts.strftime("%Y-%m-%d %H:%M UTC")


def run_state(final: bool, state: str) -> str:
    """``final``, ``final (failed)`` / ``final (cancelled)``, or ``in progress``."""
    if not final:
        return "in progress"
    if state and state not in ("succeeded", "running"):
        return f"final ({state})"
    return "final"


def metric_cells(metrics: pd.DataFrame, index: list[str]) -> pd.DataFrame:
    """Long figures (one row per metric) to one formatted column per headline metric.

    ``index`` names the columns that identify a row (for example ``["run_id"]`` or
    ``["task"]``); metrics the dashboard does not headline are dropped; a headline metric
    missing for a row shows ``n/a``.
    """
    labels = [metric_label(k) for k in METRIC_KEYS]
    if metrics.empty:
        return pd.DataFrame(columns=[*index, *labels])
    rows = metrics[metrics["metric"].isin(METRIC_KEYS)].copy()
    rows["cell"] = [
        format_figure(
            r.value, r.lower, r.upper,
            has_interval=bool(r.has_interval), too_few_subjects=bool(r.too_few_subjects),
        )
        for r in rows.itertuples(index=False)
    ]  # fmt: skip
    wide = rows.pivot_table(index=index, columns="metric", values="cell", aggfunc="first")
    wide = wide.reindex(columns=list(METRIC_KEYS)).fillna(NOT_AVAILABLE)
    wide.columns = labels
    return wide.reset_index()


@dataclass(frozen=True)
class Table:
    """A display table and the footnotes its cells call for."""

    frame: pd.DataFrame
    too_few_subjects: bool = False
    in_progress: bool = False


def fleet_table(runs: pd.DataFrame, metrics: pd.DataFrame) -> Table:
    """One row per model's latest run: who, which run, its state, and each headline figure."""
    base = pd.DataFrame(
        {
            "Model": runs["model_name"],
            "Version": runs["model_version"],
            "Run": runs["run_id"],
            "Benchmark": runs["benchmark_id"],
            "Started": [format_time(t) for t in runs["start_time"]],
            "State": [run_state(bool(f), s) for f, s in zip(runs["final"], runs["state"], strict=True)],
            "Responses": runs["response_count"].astype("int64"),
        }
    )  # fmt: skip
    cells = metric_cells(metrics, ["run_id"]).rename(columns={"run_id": "Run"})
    frame = base.merge(cells, on="Run", how="left")
    labels = [metric_label(k) for k in METRIC_KEYS]
    frame[labels] = frame[labels].fillna(NOT_AVAILABLE)
    mine = metrics[metrics["run_id"].isin(runs["run_id"]) & metrics["metric"].isin(METRIC_KEYS)]
    return Table(
        frame=frame.reset_index(drop=True),
        too_few_subjects=bool(mine["too_few_subjects"].any()) if len(mine) else False,
        in_progress=bool((~runs["final"].astype(bool)).any()) if len(runs) else False,
    )


def task_table(breakdown: pd.DataFrame, fmt: str = "all") -> Table:
    """Rows per task (pooled "all tasks" first) for one format, columns the headline figures."""
    rows = breakdown[(breakdown["format"] == fmt) & (breakdown["group_axis"] == "")]
    if rows.empty:
        return Table(
            pd.DataFrame(columns=["Task", "Responses", "Subjects", *METRIC_LABELS.values()])
        )
    counts = rows.groupby("task", as_index=False).agg(
        Responses=("response_count", "max"), Subjects=("subject_count", "max")
    )
    frame = counts.merge(metric_cells(rows, ["task"]), on="task", how="left")
    frame["_order"] = (frame["task"] != "all").astype(int)
    frame = frame.sort_values(["_order", "task"]).drop(columns="_order")
    frame["task"] = frame["task"].replace({"all": "all tasks"})
    frame = frame.rename(columns={"task": "Task"}).reset_index(drop=True)
    metric_rows = rows[rows["metric"].isin(METRIC_KEYS)]
    return Table(
        frame=frame,
        too_few_subjects=bool(metric_rows["too_few_subjects"].any()),
        in_progress=not bool(metric_rows["final"].all()) if len(metric_rows) else False,
    )


def formats_of(breakdown: pd.DataFrame) -> list[str]:
    """The formats present in a run's figures, pooled "all" first."""
    found = sorted(set(breakdown["format"]) - {"all"})
    return ["all", *found]


def tasks_of(breakdown: pd.DataFrame) -> list[str]:
    """The tasks present in a run's figures, pooled "all" first."""
    found = sorted(set(breakdown["task"]) - {"all"})
    return ["all", *found]


def trend_points(points: pd.DataFrame) -> pd.DataFrame:
    """Trend points ready for charting: finite values only, with text for the tooltip."""
    df = points.copy()
    df = df[[not _missing(v) for v in df["value"]]] if len(df) else df
    df["figure"] = [
        format_figure(r.value, r.lower, r.upper, has_interval=bool(r.has_interval))
        for r in df.itertuples(index=False)
    ]
    df["status"] = ["final" if f else "in progress" for f in df["final"]]
    df["started"] = [format_time(t) for t in df["run_start_time"]]
    return df.reset_index(drop=True)


def reliability_bins(bins: pd.DataFrame) -> pd.DataFrame:
    """Bins with their edges as fractions, a label and the count text; empty bins kept (count 0).

    A bin is drawn from its lower edge to the next bin's lower edge (the top bin to 100%), so
    the bars tile the axis whether ``upper_percent`` is reported inclusive (9, 19, ...) or
    exclusive (10, 20, ...).
    """
    df = bins.sort_values("lower_percent").reset_index(drop=True)
    df["bin_lower"] = df["lower_percent"] / 100.0
    upper = [*df["lower_percent"].iloc[1:], max(100, *df["upper_percent"])] if len(df) else []
    df["bin_upper"] = [u / 100.0 for u in upper]
    df["bin"] = [
        f"{lo}-{hi}%" for lo, hi in zip(df["lower_percent"], df["upper_percent"], strict=True)
    ]
    df["bin_mid"] = (df["bin_lower"] + df["bin_upper"]) / 2.0
    df["count_text"] = [f"n={int(c)}" for c in df["count"]]
    df["label_y"] = [0.0 if _missing(a) else float(a) for a in df["accuracy"]]
    df["gap"] = df["mean_confidence"] - df["accuracy"]
    return df


def reliability_table(bins: pd.DataFrame) -> pd.DataFrame:
    """The bins as a small table: range, count, mean confidence, accuracy."""
    return pd.DataFrame(
        {
            "Confidence bin": [
                f"{lo}-{hi}%"
                for lo, hi in zip(bins["lower_percent"], bins["upper_percent"], strict=True)
            ],
            "Answers": bins["count"].astype("int64"),
            "Mean confidence": [format_value(v) for v in bins["mean_confidence"]],
            "Accuracy": [format_value(v) for v in bins["accuracy"]],
        }
    )


def alerts_table(alerts: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "Raised": [format_time(t) for t in alerts["create_time"]],
            "Severity": alerts["severity"],
            "Model": alerts["model_name"],
            "Kind": alerts["kind"],
            "Message": alerts["message"],
            "Run": alerts["run_id"],
        }
    )


def endpoints_table(endpoints: pd.DataFrame) -> pd.DataFrame:
    def every(seconds: float) -> str:
        return f"every {seconds / 60:g} min" if seconds > 0 else "manual only"

    return pd.DataFrame(
        {
            "Endpoint": endpoints["name"],
            "Address": endpoints["address"],
            "Protocol": endpoints["protocol"],
            "Schedule": [every(float(s)) for s in endpoints["schedule_interval_s"]],
            "Scheduled benchmark": endpoints["schedule_benchmark"],
        }
    )


def gateway_runs_table(runs: pd.DataFrame) -> pd.DataFrame:
    progress = [
        (int(c) / int(n)) if int(n) > 0 else 0.0
        for c, n in zip(runs["completed_count"], runs["item_count"], strict=True)
    ]
    return pd.DataFrame(
        {
            "Run": runs["run_id"],
            "Endpoint": runs["endpoint_name"],
            "Model": runs["model_name"],
            "Benchmark": runs["benchmark_id"],
            "State": runs["state"],
            "Progress": progress,
            "Items": [
                f"{int(c)}/{int(n)}"
                for c, n in zip(runs["completed_count"], runs["item_count"], strict=True)
            ],
            "Errors": runs["error_count"].astype("int64"),
            "Trigger": runs["trigger"],
            "Created": [format_time(t) for t in runs["create_time"]],
            "Problem": runs["error_message"],
        }
    )


# ---- credibility, text-only drop, regressions ------------------------------------------------

CREDIBILITY_CAPTION = (
    "Each question about what the image shows at the high level (a tumour, its side) is paired "
    "with each basic question about the same image (sequence, plane, is it a brain MRI). "
    "**Luck rate**: of the right high-level answers, the share on images whose basic question "
    "the model got wrong. **Shortcut probability**: when the basic question was wrong, how "
    "often the high-level answer was right anyway. **Rationality** = 1 - luck rate. High "
    "shortcut probability means right answers that do not come from reading the image."
)
DROP_CAPTION = (
    "Accuracy with the image minus accuracy when the same questions are sent without it. A "
    "drop near zero means the model scores as well without looking: the score does not "
    "measure image reading."
)
REGRESSION_CAPTION = (
    "Each run against the same model's previous run on the same questions: the change of "
    "each figure with a 95% interval in which both runs are resampled with the same subjects. "
    "A figure regressed when the interval lies wholly on the bad side of zero and the change "
    "exceeds the margin; accuracy also gets a clustered McNemar test (p-value)."
)


def _cell(value: object, lower: object, upper: object, has: object, too_few: object) -> str:
    return format_figure(
        value, lower, upper, has_interval=bool(has), too_few_subjects=bool(too_few)
    )


def credibility_table(cred: pd.DataFrame) -> Table:
    """One row per run: groups A-D and the three ratios with their intervals."""
    columns = ["Model", "Run", "Images", "Pairs", "A", "B", "C", "D", "Luck rate",
               "Shortcut probability", "Rationality", "High-level accuracy"]  # fmt: skip
    if cred.empty:
        return Table(pd.DataFrame(columns=columns))
    rows = cred.itertuples(index=False)
    frame = pd.DataFrame(
        [
            [r.model_name, r.run_id, int(r.image_count), int(r.pair_count), int(r.a_count),
             int(r.b_count), int(r.c_count), int(r.d_count),
             _cell(r.luck_rate, r.luck_lower, r.luck_upper, r.has_interval, r.too_few_subjects),
             _cell(r.shortcut_probability, r.shortcut_lower, r.shortcut_upper, r.has_interval,
                   r.too_few_subjects),
             _cell(r.rationality, r.rationality_lower, r.rationality_upper, r.has_interval,
                   r.too_few_subjects),
             format_value(r.high_level_accuracy)]
            for r in rows
        ],
        columns=columns,
    )  # fmt: skip
    return Table(
        frame,
        too_few_subjects=bool(cred["too_few_subjects"].any()),
        in_progress=not bool(cred["final"].all()),
    )


def correlation_text(correlations: pd.DataFrame) -> list[str]:
    """One sentence per benchmark about the shortcut-accuracy correlation across models."""
    out = []
    for r in correlations.itertuples(index=False):
        bench = str(r.benchmark_hash)[:12]
        if bool(r.has_correlation):
            out.append(
                f"Benchmark `{bench}`: across {int(r.model_count)} models, shortcut probability "
                f"and high-level accuracy correlate with r = {float(r.r):.2f} "
                f"(p = {float(r.p_value):.3g})."
            )
        else:
            out.append(
                f"Benchmark `{bench}`: no correlation across models yet ({r.note}; "
                f"{int(r.model_count)} so far)."
            )
    return out


def drops_table(drops: pd.DataFrame) -> Table:
    """One row per model and task: accuracy with and without images and the drop."""
    columns = ["Model", "Task", "With image", "Text only", "Drop", "Subjects"]
    if drops.empty:
        return Table(pd.DataFrame(columns=columns))
    df = drops.copy()
    df["_order"] = (df["task"] != "all").astype(int)
    df = df.sort_values(["model_name", "_order", "task"])
    frame = pd.DataFrame(
        {
            "Model": df["model_name"],
            "Task": df["task"].replace({"all": "all tasks"}),
            "With image": [format_value(v) for v in df["image_accuracy"]],
            "Text only": [format_value(v) for v in df["text_accuracy"]],
            "Drop": [
                _cell(r.drop, r.lower, r.upper, r.has_interval, r.too_few_subjects)
                for r in df.itertuples(index=False)
            ],
            "Subjects": df["subject_count"].astype("int64"),
        }
    )
    return Table(frame.reset_index(drop=True), too_few_subjects=bool(df["too_few_subjects"].any()))


def regressions_table(diffs: pd.DataFrame, headline_only: bool = True) -> Table:
    """One row per (run, task, headline metric): before, after and the paired change."""
    columns = ["Model", "Run", "Against", "Task", "Metric", "Before", "After", "Change",
               "Regressed", "McNemar p"]  # fmt: skip
    rows = diffs[diffs["metric"].isin(METRIC_KEYS)] if headline_only else diffs
    if rows.empty:
        return Table(pd.DataFrame(columns=columns))
    frame = pd.DataFrame(
        {
            "Model": rows["model_name"],
            "Run": rows["run_id"],
            "Against": rows["base_run_id"],
            "Task": rows["task"].replace({"all": "all tasks"}),
            "Metric": [metric_label(m) for m in rows["metric"]],
            "Before": [format_value(v) for v in rows["base_value"]],
            "After": [format_value(v) for v in rows["value"]],
            "Change": [
                _cell(r.difference, r.lower, r.upper, r.has_interval, r.too_few_subjects)
                for r in rows.itertuples(index=False)
            ],
            "Regressed": ["yes" if r else "" for r in rows["regressed"]],
            "McNemar p": [
                "" if _missing(p) else f"{float(p):.3g}" for p in rows["mcnemar_p_value"]
            ],
        }
    )
    return Table(
        frame.reset_index(drop=True), too_few_subjects=bool(rows["too_few_subjects"].any())
    )
