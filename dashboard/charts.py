"""Altair charts for the dashboard. Pure: prepared frames in (see ``views.py``), chart specs out."""

from __future__ import annotations

import altair as alt
import pandas as pd

_UNIT = alt.Scale(domain=[0, 1], nice=False)


def trend_chart(points: pd.DataFrame, metric_label: str) -> alt.LayerChart:
    """One line per model over its runs, a point per run, and 95% interval bars where final.

    ``points`` is :func:`dashboard.views.trend_points` output.
    """
    x = alt.X(
        "run_start_time:T",
        title="Run started (UTC)",
        scale=alt.Scale(type="utc"),
        axis=alt.Axis(format="%b %d %H:%M", labelAngle=-30, labelOverlap=True),
    )
    color = alt.Color("model_name:N", title="Model")
    tooltip = [
        alt.Tooltip("model_name:N", title="Model"),
        alt.Tooltip("run_id:N", title="Run"),
        alt.Tooltip("started:N", title="Started"),
        alt.Tooltip("figure:N", title=metric_label),
        alt.Tooltip("status:N", title="State"),
    ]
    lines = (
        alt.Chart(points)
        .mark_line(point=alt.OverlayMarkDef(filled=True, size=60))
        .encode(x=x, y=alt.Y("value:Q", title=metric_label, scale=_UNIT), color=color,
                tooltip=tooltip)
    )  # fmt: skip
    with_interval = points[points["has_interval"].astype(bool)] if len(points) else points
    bars = (
        alt.Chart(with_interval)
        .mark_errorbar(ticks=True)
        .encode(x=x, y=alt.Y("lower:Q", title=metric_label, scale=_UNIT), y2="upper:Q",
                color=color, tooltip=tooltip)
    )  # fmt: skip
    return alt.LayerChart(layer=[bars, lines], height=320)


def reliability_chart(bins: pd.DataFrame) -> alt.LayerChart:
    """Accuracy per confidence bin against the diagonal of perfect calibration.

    Bars span each bin's confidence range up to its accuracy; a dot marks the bin's mean stated
    confidence (sized by the number of answers); the count is written above each bar.
    ``bins`` is :func:`dashboard.views.reliability_bins` output.
    """
    x_title = "Stated confidence"
    y_title = "Accuracy"
    tooltip = [
        alt.Tooltip("bin:N", title="Confidence bin"),
        alt.Tooltip("count:Q", title="Answers"),
        alt.Tooltip("mean_confidence:Q", title="Mean confidence", format=".3f"),
        alt.Tooltip("accuracy:Q", title="Accuracy", format=".3f"),
    ]
    base = alt.Chart(bins)
    bars = base.mark_rect(opacity=0.55, stroke="white").encode(
        x=alt.X("bin_lower:Q", title=x_title, scale=_UNIT),
        x2="bin_upper:Q",
        y=alt.Y("accuracy:Q", title=y_title, scale=_UNIT),
        y2=alt.datum(0),
        tooltip=tooltip,
    )
    dots = base.mark_circle(color="#d62728", opacity=0.9).encode(
        x=alt.X("mean_confidence:Q", title=x_title, scale=_UNIT),
        y=alt.Y("accuracy:Q", title=y_title, scale=_UNIT),
        size=alt.Size("count:Q", title="Answers", scale=alt.Scale(range=[30, 300])),
        tooltip=tooltip,
    )
    counts = base.mark_text(dy=-18, fontSize=11).encode(
        x=alt.X("bin_mid:Q", scale=_UNIT),
        y=alt.Y("label_y:Q", scale=_UNIT),
        text="count_text:N",
    )
    diagonal = (
        alt.Chart(pd.DataFrame({"x": [0.0, 1.0], "y": [0.0, 1.0]}))
        .mark_line(strokeDash=[5, 5], color="gray")
        .encode(x=alt.X("x:Q", scale=_UNIT), y=alt.Y("y:Q", scale=_UNIT))
    )
    return alt.LayerChart(layer=[bars, diagonal, dots, counts], height=360)


def shortcut_chart(cred: pd.DataFrame) -> alt.Chart:
    """Shortcut probability against high-level accuracy, one point per model's latest run.

    ``cred`` is :func:`dashboard.client.credibility` output (finite points only are drawn).
    """
    return (
        alt.Chart(cred)
        .mark_circle(size=90)
        .encode(
            x=alt.X("shortcut_probability:Q", title="Shortcut probability", scale=_UNIT),
            y=alt.Y("high_level_accuracy:Q", title="High-level accuracy", scale=_UNIT),
            color=alt.Color("model_name:N", title="Model"),
            tooltip=[
                alt.Tooltip("model_name:N", title="Model"),
                alt.Tooltip("run_id:N", title="Run"),
                alt.Tooltip("shortcut_probability:Q", title="Shortcut probability", format=".3f"),
                alt.Tooltip("high_level_accuracy:Q", title="High-level accuracy", format=".3f"),
            ],
        )
        .properties(height=300)
    )
