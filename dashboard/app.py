"""Vigil's dashboard: what hospital oversight teams see. Run by ``vigil serve dashboard``.

Read-only: every figure comes from the grader's and the gateway's gRPC APIs (never a DuckDB
file). Settings come from ``VIGIL_DASHBOARD_*`` environment variables, because ``streamlit run``
cannot take Vigil's flags. Each render opens one channel per service and closes it at the end,
so a service that comes back shows up on the next refresh. A service that is down is named on
the page and the sections that do not need it still render.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

import pandas as pd
import streamlit as st
from pydantic import ValidationError
from streamlit.elements.lib.column_types import ColumnConfig

from dashboard import charts, client, views
from dashboard.settings import DashboardSettings

FORMAT_LABELS = {"all": "all formats", "mc": "multiple choice", "open": "open-ended"}
FOOTNOTE_TOO_FEW = (
    f"[{views.NO_INTERVAL}] the group has too few distinct subjects for a 95% interval; "
    "the point figure is shown without one."
)
FOOTNOTE_IN_PROGRESS = (
    "A run in progress shows point figures only; 95% intervals (a bootstrap over whole "
    "subjects) come when the run ends."
)


@contextmanager
def guarded(what: str) -> Iterator[None]:
    """Show a failed call as an error on the page and carry on with the next section."""
    try:
        yield
    except client.ClientError as exc:
        st.error(f"{exc} {what} cannot be shown.")


def _metric_columns() -> dict[str, ColumnConfig]:
    return {
        m.label: st.column_config.TextColumn(m.label, help=m.meaning.capitalize() + ".")
        for m in views.METRICS
    }


def header(
    settings: DashboardSettings, grader: client.Conn, gateway: client.Conn
) -> tuple[bool, pd.DataFrame | None]:
    """Title, refresh and each service's status.

    Returns whether the grader answers, and the gateway's endpoints (None when it does not).
    """
    left, right = st.columns([5, 1], vertical_alignment="bottom")
    left.title("Vigil: model oversight")
    left.caption(
        "Continuous audits of deployed medical-imaging vision-language models: accuracy, "
        "calibration of stated confidence, and confident errors, per model and over time."
    )
    right.button("Refresh", key="refresh", help="Ask the grader and the gateway again.")
    right.caption(f"Shown {datetime.now(UTC):%H:%M:%S} UTC")

    grader_up = True
    try:
        status = client.grader_status(grader)
    except client.ClientError as exc:
        grader_up = False
        st.error(
            f"{exc} Figures, trends, reliability diagrams and alerts need the grader: check "
            "that `vigil serve grader` is running and that VIGIL_DASHBOARD_GRADER_ADDRESS "
            "points to it."
        )
    try:
        endpoints = client.endpoints(gateway)
    except client.ClientError as exc:
        endpoints = None
        st.error(
            f"{exc} Endpoints and runs need the gateway: check that `vigil serve gateway` is "
            "running and that VIGIL_DASHBOARD_GATEWAY_ADDRESS points to it."
        )

    g_col, w_col = st.columns(2)
    if grader_up:
        g_col.markdown(
            f":green[●] **Grader** `{settings.grader_address}`: {status.graded_count:,} graded "
            f"responses, read up to log position {status.last_seq:,}."
        )
        if not status.gateway_connected:
            st.warning(
                "The grader is not following the gateway's response log right now; figures may "
                "lag behind the latest responses."
            )
    else:
        g_col.markdown(f":red[●] **Grader** `{settings.grader_address}`: not reachable.")
    if endpoints is not None:
        w_col.markdown(
            f":green[●] **Gateway** `{settings.gateway_address}`: "
            f"{len(endpoints)} registered endpoint{'s' if len(endpoints) != 1 else ''}."
        )
    else:
        w_col.markdown(f":red[●] **Gateway** `{settings.gateway_address}`: not reachable.")
    return grader_up, endpoints


def fleet_section(fleet: client.Fleet) -> None:
    st.header("Fleet")
    st.caption("Each model's latest run; figures pooled over every task and question format.")
    table = views.fleet_table(fleet.runs, fleet.metrics)
    st.dataframe(
        table.frame,
        hide_index=True,
        column_order=[
            "Model",
            "Version",
            "State",
            *views.METRIC_LABELS.values(),
            "Responses",
            "Run",
            "Benchmark",
            "Started",
        ],  # fmt: skip
        column_config={
            "Model": st.column_config.TextColumn("Model", pinned=True),
            "Run": st.column_config.TextColumn("Run", help="The run's id at the gateway."),
            "State": st.column_config.TextColumn(
                "State", help="final: the run ended and its figures carry 95% intervals."
            ),
            "Responses": st.column_config.NumberColumn("Responses", help="Graded responses."),
            **_metric_columns(),
        },
        key="fleet_table",
    )
    notes = ["Cells read `value [95% interval]`."]
    if table.too_few_subjects:
        notes.append(FOOTNOTE_TOO_FEW)
    if table.in_progress:
        notes.append(FOOTNOTE_IN_PROGRESS)
    st.caption(" ".join(notes))
    st.caption(views.metric_caption())


def task_section(breakdown: pd.DataFrame, model: str, run_id: str) -> None:
    st.header("Per task")
    st.caption(f"Latest run `{run_id}` of **{model}**.")
    formats = views.formats_of(breakdown)
    fmt = st.radio(
        "Question format",
        formats,
        format_func=lambda f: FORMAT_LABELS.get(f, f),
        horizontal=True,
        key="task_format",
    )
    table = views.task_table(breakdown, fmt or "all")
    st.dataframe(
        table.frame,
        hide_index=True,
        column_config={
            "Task": st.column_config.TextColumn("Task", pinned=True),
            "Subjects": st.column_config.NumberColumn("Subjects", help="Distinct subjects."),
            **_metric_columns(),
        },
        key="task_table",
    )
    if table.too_few_subjects:
        st.caption(FOOTNOTE_TOO_FEW)


def trend_section(grader: client.Conn) -> None:
    st.header("Trend")
    metric = st.selectbox(
        "Metric", list(views.METRIC_KEYS), format_func=views.metric_label, key="trend_metric"
    )
    label = views.metric_label(metric)
    points = views.trend_points(client.trend(grader, metric))
    if points.empty:
        st.info(f"No {label.lower()} figures yet.")
        return
    st.altair_chart(charts.trend_chart(points, label), width="stretch", key="trend_chart")
    st.caption(
        f"{label} of each model's runs (all tasks and formats pooled). Bars are 95% intervals "
        "of finished runs; a run in progress has a point only."
    )


def reliability_section(grader: client.Conn, breakdown: pd.DataFrame, model: str,
                        run_id: str) -> None:  # fmt: skip
    st.header("Reliability diagram")
    st.caption(
        f"Latest run `{run_id}` of **{model}**: accuracy of answers grouped by the confidence "
        "the model stated. A calibrated model sits on the dashed diagonal; bars below it are "
        "overconfidence. Each bar is labelled with its number of answers."
    )
    task_col, fmt_col = st.columns(2)
    task = task_col.selectbox("Task", views.tasks_of(breakdown), key="reliability_task")
    fmt = fmt_col.selectbox(
        "Question format",
        views.formats_of(breakdown),
        format_func=lambda f: FORMAT_LABELS.get(f, f),
        key="reliability_format",
    )
    bins = client.reliability(grader, run_id, task or "all", fmt or "all")
    if bins.empty or int(bins["count"].sum()) == 0:
        st.info("No answered items with a stated confidence in this group.")
        return
    prepared = views.reliability_bins(bins)
    chart_col, table_col = st.columns([3, 2])
    chart_col.altair_chart(charts.reliability_chart(prepared), width="stretch",
                           key="reliability_chart")  # fmt: skip
    table_col.dataframe(views.reliability_table(bins), hide_index=True, key="reliability_table")


TOKEN_METRICS = {
    "mean_confidence": "mean confidence",
    "accuracy": "accuracy",
    "ece": "ECE",
    "brier": "Brier",
    "auroc": "AUROC (right vs wrong)",
}


def _figure(rows: pd.DataFrame) -> str:
    if rows.empty:
        return views.NOT_AVAILABLE
    r = rows.iloc[0]
    return views.format_figure(
        r["value"], r["lower"], r["upper"],
        has_interval=bool(r["has_interval"]), too_few_subjects=bool(r["too_few_subjects"]),
    )  # fmt: skip


def token_section(grader: client.Conn, model: str, run_id: str) -> None:
    """Stated confidence beside the probability the model gave its own answer token."""
    token = client.metric_values(
        grader, run_id=run_id, group_axis="confidence_source", metrics=list(TOKEN_METRICS)
    )
    if token.empty:
        return
    stated = client.metric_values(
        grader, run_id=run_id, task="all", fmt="all", metrics=list(TOKEN_METRICS)
    )
    st.header("Stated confidence vs answer-token probability")
    st.caption(
        f"Latest run `{run_id}` of **{model}**, answers whose token probability the model "
        f"reported ({int(token['response_count'].iloc[0])}). If the probability the model gave its "
        "own answer is better calibrated than the confidence it writes, the written number is "
        "the weaker signal."
    )
    rows = []
    for metric, label in TOKEN_METRICS.items():
        s = stated[stated["metric"] == metric]
        t = token[token["metric"] == metric]
        rows.append(
            {
                "figure": label,
                "stated confidence": _figure(s),
                "answer-token probability": _figure(t),
            }
        )
    st.dataframe(pd.DataFrame(rows), hide_index=True, key="token_table")


def alerts_section(grader: client.Conn) -> None:
    st.header("Alerts")
    alerts = client.alerts(grader)
    if alerts.empty:
        st.success("No alerts.")
        return
    critical = int((alerts["severity"] == "critical").sum())
    summary = f"{len(alerts)} alert{'s' if len(alerts) != 1 else ''}"
    if critical:
        st.error(f"{summary}, {critical} critical.")
    else:
        st.warning(f"{summary}.")
    st.dataframe(views.alerts_table(alerts), hide_index=True, key="alerts_table")


def credibility_section(grader: client.Conn) -> None:
    st.header("Credibility")
    cred = client.credibility(grader, latest_only=True)
    cred = cred[cred["image_mode"] != "text_only"]
    if cred.empty or int(cred["pair_count"].sum()) == 0:
        st.info(
            "No credibility figures yet: they need images with both basic and high-level questions."
        )
        return
    table = views.credibility_table(cred)
    st.dataframe(table.frame, hide_index=True, key="credibility_table")
    notes = [views.CREDIBILITY_CAPTION]
    if table.too_few_subjects:
        notes.append(FOOTNOTE_TOO_FEW)
    st.caption(" ".join(notes))
    points = cred[
        pd.to_numeric(cred["shortcut_probability"]).notna()
        & pd.to_numeric(cred["high_level_accuracy"]).notna()
    ]
    if len(points):
        st.altair_chart(charts.shortcut_chart(points), width="stretch", key="shortcut_chart")
    for line in views.correlation_text(client.shortcut_correlations(grader)):
        st.caption(line)


def text_only_section(grader: client.Conn) -> None:
    st.header("Text-only drop")
    table = views.drops_table(client.text_only_drops(grader, latest_only=True))
    if table.frame.empty:
        st.info(
            "No text-only runs yet. Start one with the gateway's StartRun(text_only=true) to "
            "see how much of each model's score needs no image."
        )
        return
    st.dataframe(table.frame, hide_index=True, key="text_only_table")
    st.caption(views.DROP_CAPTION + (" " + FOOTNOTE_TOO_FEW if table.too_few_subjects else ""))


def regressions_section(grader: client.Conn, model: str) -> None:
    st.header("Regressions")
    diffs = client.regressions(grader, model_name=model)
    if diffs.empty:
        st.info(f"No earlier run of **{model}** on the same questions to compare with yet.")
        return
    newest = diffs["run_id"].iloc[0]
    table = views.regressions_table(diffs[diffs["run_id"] == newest])
    regressed = int((table.frame["Regressed"] == "yes").sum())
    if regressed:
        st.error(f"{regressed} figure{'s' if regressed != 1 else ''} regressed in run `{newest}`.")
    else:
        st.success(f"No figure of **{model}** regressed in run `{newest}`.")
    st.dataframe(table.frame, hide_index=True, key="regressions_table")
    st.caption(
        views.REGRESSION_CAPTION + (" " + FOOTNOTE_TOO_FEW if table.too_few_subjects else "")
    )


def gateway_section(gateway: client.Conn, endpoints: pd.DataFrame) -> None:
    st.header("Deployments")
    if endpoints.empty:
        st.info("No endpoints registered at the gateway yet.")
    else:
        st.subheader("Endpoints")
        st.dataframe(views.endpoints_table(endpoints), hide_index=True, key="endpoints_table")
    runs = client.gateway_runs(gateway)
    if runs.empty:
        return
    st.subheader("Recent runs")
    st.dataframe(
        views.gateway_runs_table(runs),
        hide_index=True,
        column_config={
            "Progress": st.column_config.ProgressColumn(
                "Progress", min_value=0.0, max_value=1.0, format="percent"
            ),
            "Errors": st.column_config.NumberColumn(
                "Errors", help="Responses that timed out or failed in transport."
            ),
        },
        key="gateway_runs_table",
    )


def grader_sections(grader: client.Conn) -> None:
    fleet: client.Fleet | None = None
    with guarded("The fleet table"):
        fleet = client.fleet(grader)
    if fleet is None:
        return
    if fleet.runs.empty:
        st.info(
            "No graded runs yet. Register an endpoint at the gateway and start a run; figures "
            "appear here as the grader grades the responses."
        )
        return
    fleet_section(fleet)

    st.divider()
    models = list(fleet.runs["model_name"])
    model = st.columns([1, 2])[0].selectbox(
        "Model", models, key="model", help="The model whose latest run the sections below show."
    )
    run = fleet.runs[fleet.runs["model_name"] == model].iloc[0]
    run_id = str(run["run_id"])
    breakdown = pd.DataFrame(columns=client.METRIC_COLUMNS)
    with guarded("The per-task breakdown"):
        breakdown = client.run_breakdown(grader, run_id)
        task_section(breakdown, str(model), run_id)
    with guarded("The trend"):
        trend_section(grader)
    with guarded("The reliability diagram"):
        reliability_section(grader, breakdown, str(model), run_id)
    with guarded("The answer-token comparison"):
        token_section(grader, str(model), run_id)
    with guarded("Credibility"):
        credibility_section(grader)
    with guarded("The text-only drop"):
        text_only_section(grader)
    with guarded("Regressions"):
        regressions_section(grader, str(model))
    with guarded("Alerts"):
        alerts_section(grader)


def main() -> None:
    st.set_page_config(page_title="Vigil", page_icon="🩺", layout="wide")
    try:
        settings = DashboardSettings()
    except ValidationError as exc:
        st.error(f"Invalid VIGIL_DASHBOARD_* settings: {exc}")
        st.stop()
    with (
        client.connect(client.GRADER, settings.grader_address, settings.rpc_timeout_s) as grader,
        client.connect(client.GATEWAY, settings.gateway_address, settings.rpc_timeout_s) as gw,
    ):
        grader_up, endpoints = header(settings, grader, gw)
        st.divider()
        if grader_up:
            grader_sections(grader)
            st.divider()
        if endpoints is not None:
            with guarded("Recent runs"):
                gateway_section(gw, endpoints)


if __name__ == "__main__":
    main()
