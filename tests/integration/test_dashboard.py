"""The dashboard against real services: a random-backend model server, a gateway and a grader.

The page is rendered with Streamlit's ``AppTest`` (the script as ``streamlit run`` runs it, minus
the browser), with the services' addresses passed the way ``vigil serve dashboard`` passes them:
``VIGIL_DASHBOARD_*`` environment variables. The pure display logic of ``dashboard.views`` is
tested at the bottom against hand-built frames.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from dashboard import views
from dashboard.settings import DashboardSettings, settings_env
from tests.stack import (
    REPO,
    Proc,
    Stack,
    gateway_stub,
    grader_stub,
    register,
    wait_graded,
    wait_run,
)
from vigil.gateway.v1 import gateway_pb2 as gw
from vigil.grader.v1 import grader_pb2 as gr

APP = str(REPO / "dashboard" / "app.py")
ENV_KEYS = ("GRADER_ADDRESS", "GATEWAY_ADDRESS", "RPC_TIMEOUT_S")


@dataclass
class Audited:
    """A stack with one finished, graded run, and two broken graders to point the page at."""

    stack: Stack
    gateway: Proc
    grader: Proc
    run_id: str
    model_name: str
    dead_grader_address: str
    empty_grader: Proc


@pytest.fixture(scope="module")
def benchmark_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from benchmark.store import ensure_builtin

    root = tmp_path_factory.mktemp("benchmarks")
    ensure_builtin(root, "brain-mri", "small", seed=0, progress=False)
    return root


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory, benchmark_root: Path) -> Iterator[Audited]:
    stack = Stack(tmp_path_factory.mktemp("stack"), benchmark_root)
    try:
        model = stack.start_model("model", "random")
        gateway = stack.start_gateway()
        grader = stack.start_grader(gateway, extra=["--bootstrap-resamples", "200"])
        # A grader that ran and stopped: nothing listens at its address any more.
        dead = stack.start_grader(gateway, name="dead", db=stack.root / "dead.duckdb")
        dead_address = dead.address
        stack.stop("dead")
        # A fresh grader with an empty file, following nothing (the stopped grader's address).
        empty = stack.start(
            "empty",
            ["grader", "--db-path", str(stack.root / "empty.duckdb"),
             "--benchmark-root", str(benchmark_root), "--gateway-address", dead_address],
        )  # fmt: skip

        gateway_api = gateway_stub(gateway.address)
        register(gateway_api, "random-model", model.address)
        run = gateway_api.StartRun(
            gw.StartRunRequest(endpoint_name="random-model", benchmark="brain-mri-small"),
            timeout=10,
        ).run
        run = wait_run(gateway_api, run.run_id)
        assert run.state == gw.RUN_STATE_SUCCEEDED, run
        wait_graded(grader_stub(grader.address), [run.run_id])
        yield Audited(stack, gateway, grader, run.run_id, run.model_name, dead_address, empty)
    finally:
        # Graders first: a gateway with a follower's stream open waits out its stop grace.
        for name in ("empty", "grader"):
            if name in stack.procs:
                stack.stop(name)
        stack.close()


def render(monkeypatch: pytest.MonkeyPatch, grader: str, gateway: str) -> AppTest:
    for key in ENV_KEYS:
        monkeypatch.delenv(f"VIGIL_DASHBOARD_{key}", raising=False)
    monkeypatch.setenv("VIGIL_DASHBOARD_GRADER_ADDRESS", grader)
    monkeypatch.setenv("VIGIL_DASHBOARD_GATEWAY_ADDRESS", gateway)
    at = AppTest.from_file(APP, default_timeout=30)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def charts(at: AppTest) -> list[dict[str, object]]:
    """The Vega-Lite specs on the page (AppTest shows an altair chart as ``vega_lite_chart``)."""
    return [json.loads(el.proto.spec) for el in at.get("vega_lite_chart")]


def table(at: AppTest, *first_columns: str) -> pd.DataFrame:
    """The one table on the page whose first columns are ``first_columns``."""
    n = len(first_columns)
    found = [df.value for df in at.dataframe if list(df.value.columns)[:n] == list(first_columns)]
    assert len(found) == 1, [list(df.value.columns) for df in at.dataframe]
    return found[0]


def service_errors(at: AppTest) -> list[str]:
    """Errors about a service (an alert summary may also be an ``st.error``)."""
    return [e.value for e in at.error if "not reachable" in e.value or "answered with" in e.value]


def latest_accuracy(audited: Audited) -> float:
    request = gr.QueryMetricsRequest(
        latest_only=True, task="all", format="all", group_axis="", metrics=["accuracy"]
    )
    values = grader_stub(audited.grader.address).QueryMetrics(request, timeout=10).values
    mine = [v for v in values if v.run_id == audited.run_id]
    assert len(mine) == 1, values
    return mine[0].value


def test_page_shows_the_graded_run(audited: Audited, monkeypatch: pytest.MonkeyPatch) -> None:
    at = render(monkeypatch, audited.grader.address, audited.gateway.address)

    assert not service_errors(at)
    assert not [i for i in at.info if "No graded runs yet" in i.value]
    fleet = table(at, "Model", "Version")
    row = fleet[fleet["Model"] == audited.model_name]
    assert len(row) == 1, fleet
    assert row.iloc[0]["Run"] == audited.run_id
    assert row.iloc[0]["State"] == "final"
    accuracy = latest_accuracy(audited)
    cell = row.iloc[0]["Accuracy"]
    assert cell.startswith(f"{accuracy:.3f}" if not math.isnan(accuracy) else "n/a"), cell
    # A final run of the small suite has enough subjects for intervals at the pooled level.
    assert "[" in cell and "—" not in cell, cell

    tasks = table(at, "Task")
    assert tasks.iloc[0]["Task"] == "all tasks"
    assert len(tasks) > 1

    specs = charts(at)
    assert len(specs) == 3, specs
    trend, reliability, shortcut = specs
    assert "Run started" in str(trend)
    assert "Stated confidence" in str(reliability)
    assert "Shortcut probability" in str(shortcut)

    # Credibility of the latest run, with groups A-D adding up to the pairs.
    cred = table(at, "Model", "Run", "Images")
    row = cred[cred["Run"] == audited.run_id].iloc[0]
    assert row["Pairs"] == row["A"] + row["B"] + row["C"] + row["D"] > 0
    assert any("no correlation across models yet" in c.value for c in at.caption)
    # One run only: nothing to compare with, no text-only run.
    assert any("No earlier run" in i.value for i in at.info)
    assert any("No text-only runs yet" in i.value for i in at.info)
    bins = table(at, "Confidence bin")
    assert len(bins) == 10
    assert bins["Answers"].sum() > 0

    assert at.selectbox(key="trend_metric").value == "coverage"
    assert at.selectbox(key="model").value == audited.model_name
    assert list(table(at, "Endpoint")["Endpoint"]) == ["random-model"]
    runs = table(at, "Run")
    assert list(runs["Run"]) == [audited.run_id]
    assert list(runs["State"]) == ["succeeded"]
    alerts = [m.value for m in at.success if m.value == "No alerts."]
    if not alerts:  # the random model may well raise one; then it is listed
        assert set(table(at, "Raised")["Run"]) <= {audited.run_id}


def test_switching_metric_and_task(audited: Audited, monkeypatch: pytest.MonkeyPatch) -> None:
    at = render(monkeypatch, audited.grader.address, audited.gateway.address)
    at.selectbox(key="trend_metric").set_value("ece")
    task = at.selectbox(key="reliability_task").options[1]
    at.selectbox(key="reliability_task").set_value(task)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not service_errors(at)
    trend = charts(at)[0]
    assert "ECE" in str(trend)


def test_no_graded_runs(audited: Audited, monkeypatch: pytest.MonkeyPatch) -> None:
    at = render(monkeypatch, audited.empty_grader.address, audited.gateway.address)
    assert any("No graded runs yet" in i.value for i in at.info), [i.value for i in at.info]
    assert not at.error, [e.value for e in at.error]
    assert not [df for df in at.dataframe if list(df.value.columns)[:2] == ["Model", "Version"]]
    assert not charts(at)
    # The empty grader follows nothing: the page says its figures may lag.
    assert any("not following" in w.value for w in at.warning), [w.value for w in at.warning]


def test_grader_down(audited: Audited, monkeypatch: pytest.MonkeyPatch) -> None:
    at = render(monkeypatch, audited.dead_grader_address, audited.gateway.address)
    errors = [e.value for e in at.error]
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"The grader at {audited.dead_grader_address} is not reachable")
    assert not charts(at)
    # What the gateway holds still renders.
    assert list(table(at, "Endpoint")["Endpoint"]) == ["random-model"]


def test_gateway_down(audited: Audited, monkeypatch: pytest.MonkeyPatch) -> None:
    at = render(monkeypatch, audited.grader.address, audited.dead_grader_address)
    errors = service_errors(at)
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"The gateway at {audited.dead_grader_address} is not reachable")
    assert list(table(at, "Model", "Version")["Model"]) == [audited.model_name]
    assert len(charts(at)) == 3


# ---- settings and the serve command ----------------------------------------------------------


def test_settings_travel_as_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    sent = DashboardSettings(grader_address="grader:1", gateway_address="gw:2", port=8600,
                             host="0.0.0.0", rpc_timeout_s=2.5)  # fmt: skip
    for name, value in settings_env(sent).items():
        monkeypatch.setenv(name, value)
    assert DashboardSettings() == sent


def test_serve_refuses_port_zero() -> None:
    from cli.common import UsageError
    from dashboard.main import _run, add_serve_dashboard_command

    parser = argparse.ArgumentParser()
    add_serve_dashboard_command(parser.add_subparsers())
    args = parser.parse_args(["dashboard", "--port", "0", "--metrics-port", "0"])
    with pytest.raises(UsageError, match="explicit --port"):
        _run(args)


def test_streamlit_command_line() -> None:
    from dashboard.main import APP_PATH, health_url, streamlit_command

    settings = DashboardSettings(port=8600, host="0.0.0.0")
    cmd = streamlit_command(settings)
    assert cmd[1:5] == ["-m", "streamlit", "run", str(APP_PATH)]
    assert cmd[cmd.index("--server.port") + 1] == "8600"
    assert cmd[cmd.index("--server.address") + 1] == "0.0.0.0"
    assert cmd[cmd.index("--browser.gatherUsageStats") + 1] == "false"
    assert health_url(settings) == "http://127.0.0.1:8600/_stcore/health"


# ---- views: pure display logic -------------------------------------------------------------


def test_format_figure() -> None:
    assert views.format_figure(0.6123, 0.551, 0.672, has_interval=True) == "0.612 [0.55, 0.67]"
    assert views.format_figure(0.6123, too_few_subjects=True) == "0.612 [—]"
    assert views.format_figure(0.6123) == "0.612"
    assert views.format_figure(math.nan, 0.1, 0.2, has_interval=True) == "n/a"
    assert views.format_figure(None) == "n/a"
    # An interval flag without finite ends shows the point alone.
    assert views.format_figure(0.5, math.nan, math.nan, has_interval=True) == "0.500"
    assert views.format_value(1.0) == "1.000"


def test_run_state() -> None:
    assert views.run_state(True, "succeeded") == "final"
    assert views.run_state(True, "failed") == "final (failed)"
    assert views.run_state(False, "running") == "in progress"


def _metric(run_id: str, metric: str, value: float, *, task: str = "all", fmt: str = "all",
            lower: float = math.nan, upper: float = math.nan, too_few: bool = False,
            final: bool = True) -> dict[str, object]:  # fmt: skip
    return {
        "run_id": run_id, "model_name": "m-" + run_id, "task": task, "format": fmt,
        "group_axis": "", "group_value": "", "metric": metric, "value": value,
        "has_interval": not math.isnan(lower), "lower": lower, "upper": upper,
        "response_count": 40, "subject_count": 3 if too_few else 20,
        "too_few_subjects": too_few, "final": final, "run_start_time": pd.NaT,
    }  # fmt: skip


def test_fleet_table_pivots_and_flags() -> None:
    runs = pd.DataFrame(
        {
            "run_id": ["r2", "r1"], "model_name": ["m-r2", "m-r1"], "model_version": ["2", "1"],
            "endpoint_name": ["e2", "e1"], "benchmark_id": ["b", "b"],
            "benchmark_hash": ["h", "h"], "response_count": [40, 12], "final": [False, True],
            "state": ["running", "succeeded"],
            "start_time": pd.to_datetime(["2025-01-02T10:00Z", "2025-01-01T09:30Z"]),
        }
    )  # fmt: skip
    metrics = pd.DataFrame(
        [
            _metric("r1", "accuracy", 0.6123, lower=0.551, upper=0.672),
            _metric("r1", "ece", 0.31, too_few=True),
            _metric("r1", "abstention_rate", 0.1),  # not a headline metric: dropped
            _metric("r2", "accuracy", 0.5, final=False),
        ]
    )
    table = views.fleet_table(runs, metrics)
    frame = table.frame.set_index("Model")
    assert list(table.frame["Model"]) == ["m-r2", "m-r1"]
    assert frame.loc["m-r1", "Accuracy"] == "0.612 [0.55, 0.67]"
    assert frame.loc["m-r1", "ECE"] == "0.310 [—]"
    assert frame.loc["m-r1", "Coverage"] == "n/a"
    assert frame.loc["m-r2", "Accuracy"] == "0.500"
    assert frame.loc["m-r2", "State"] == "in progress"
    assert frame.loc["m-r1", "Started"] == "2025-01-01 09:30 UTC"
    assert "abstention_rate" not in table.frame.columns
    assert table.too_few_subjects and table.in_progress


def test_fleet_table_run_without_figures() -> None:
    runs = pd.DataFrame(
        {
            "run_id": ["r1"], "model_name": ["m"], "model_version": ["1"],
            "endpoint_name": ["e"], "benchmark_id": ["b"], "benchmark_hash": ["h"],
            "response_count": [0], "final": [False], "state": ["running"],
            "start_time": [pd.NaT],
        }
    )  # fmt: skip
    empty = pd.DataFrame(columns=list(_metric("x", "accuracy", 0.0)))
    table = views.fleet_table(runs, empty)
    assert table.frame.iloc[0]["Accuracy"] == "n/a"
    assert table.frame.iloc[0]["Started"] == ""


def test_task_table_orders_pooled_first() -> None:
    breakdown = pd.DataFrame(
        [
            _metric("r", "accuracy", 0.7, task="plane"),
            _metric("r", "accuracy", 0.4, task="all"),
            _metric("r", "accuracy", 0.2, task="sequence"),
            _metric("r", "accuracy", 0.9, task="plane", fmt="mc"),
        ]
    )
    table = views.task_table(breakdown, "all")
    assert list(table.frame["Task"]) == ["all tasks", "plane", "sequence"]
    assert list(table.frame["Accuracy"]) == ["0.400", "0.700", "0.200"]
    assert views.task_table(breakdown, "mc").frame["Accuracy"].tolist() == ["0.900"]
    assert views.formats_of(breakdown) == ["all", "mc"]
    assert views.tasks_of(breakdown) == ["all", "plane", "sequence"]


def test_reliability_bins_and_trend_points() -> None:
    # As the grader sends them: integer percents 10b..10b+9, the top bin 90..100.
    bins = pd.DataFrame(
        {
            "lower_percent": [10 * b for b in range(10)],
            "upper_percent": [10 * b + 9 for b in range(9)] + [100],
            "count": [0] * 9 + [7],
            "mean_confidence": [math.nan] * 9 + [0.95],
            "accuracy": [math.nan] * 9 + [0.5],
        }
    )
    prepared = views.reliability_bins(bins.iloc[::-1])
    assert list(prepared["bin"])[:2] == ["0-9%", "10-19%"]
    assert list(prepared["bin"])[-1] == "90-100%"
    # The bars tile the axis: each runs to the next bin's lower edge.
    assert prepared["bin_lower"].tolist()[1:] == prepared["bin_upper"].tolist()[:-1]
    assert prepared["bin_upper"].iloc[-1] == 1.0
    assert prepared["bin_mid"].iloc[0] == pytest.approx(0.05)
    assert list(prepared["count_text"])[-2:] == ["n=0", "n=7"]
    assert list(prepared["label_y"])[-2:] == [0.0, 0.5]
    assert views.reliability_table(bins)["Accuracy"].tolist()[-2:] == ["n/a", "0.500"]

    points = pd.DataFrame(
        {
            "run_id": ["a", "b"], "model_name": ["m", "m"],
            "run_start_time": pd.to_datetime(["2025-01-01T00:00Z", "2025-01-02T00:00Z"]),
            "value": [math.nan, 0.3], "has_interval": [False, True], "lower": [math.nan, 0.2],
            "upper": [math.nan, 0.4], "final": [False, True],
        }
    )  # fmt: skip
    shown = views.trend_points(points)
    assert list(shown["run_id"]) == ["b"]
    assert list(shown["figure"]) == ["0.300 [0.20, 0.40]"]
    assert list(shown["status"]) == ["final"]
    assert list(shown["started"]) == ["2025-01-02 00:00 UTC"]


def test_metric_caption_explains_every_headline_metric() -> None:
    caption = views.metric_caption()
    for metric in views.METRICS:
        assert metric.label in caption
    assert "80%" in caption


def test_credibility_drop_and_regression_tables() -> None:
    cred = pd.DataFrame(
        [{"run_id": "r1", "model_name": "m", "benchmark_hash": "h" * 64, "image_mode": "image",
          "image_count": 4, "pair_count": 10, "a_count": 5, "b_count": 2, "c_count": 1,
          "d_count": 2, "luck_rate": 2 / 7, "luck_lower": 0.1, "luck_upper": 0.5,
          "shortcut_probability": 2 / 3, "shortcut_lower": math.nan,
          "shortcut_upper": math.nan, "rationality": 5 / 7, "rationality_lower": 0.5,
          "rationality_upper": 0.9, "has_interval": True, "high_level_accuracy": 0.7,
          "low_level_accuracy": 0.8, "subject_count": 3, "too_few_subjects": True,
          "final": True, "run_start_time": pd.NaT}]
    )  # fmt: skip
    t = views.credibility_table(cred)
    row = t.frame.iloc[0]
    assert (row["A"], row["D"], row["Pairs"]) == (5, 2, 10)
    assert row["Luck rate"] == "0.286 [0.10, 0.50]"
    assert row["Shortcut probability"] == "0.667 [—]"  # no finite interval, too few subjects
    assert t.too_few_subjects and not t.in_progress
    corr = pd.DataFrame(
        [{"benchmark_hash": "abc", "model_count": 4, "has_correlation": True, "r": 0.693,
          "p_value": 0.0012, "note": ""},
         {"benchmark_hash": "def", "model_count": 2, "has_correlation": False, "r": math.nan,
          "p_value": math.nan, "note": "needs at least 3 models"}]
    )  # fmt: skip
    lines = views.correlation_text(corr)
    assert "r = 0.69 (p = 0.0012)" in lines[0] and "needs at least 3 models" in lines[1]

    drops = pd.DataFrame(
        [{"model_name": "m", "benchmark_hash": "h", "image_run_id": "i", "text_run_id": "t",
          "task": task, "image_accuracy": 0.8, "text_accuracy": 0.6, "drop": 0.2,
          "has_interval": task == "all", "lower": 0.1 if task == "all" else math.nan,
          "upper": 0.3 if task == "all" else math.nan, "subject_count": 12,
          "too_few_subjects": False} for task in ("plane", "all")]
    )  # fmt: skip
    d = views.drops_table(drops).frame
    assert list(d["Task"]) == ["all tasks", "plane"]
    assert list(d["Drop"]) == ["0.200 [0.10, 0.30]", "0.200"]

    diffs = pd.DataFrame(
        [{"run_id": "r2", "base_run_id": "r1", "model_name": "m", "task": "all", "metric": m,
          "base_value": 0.8, "value": 0.6, "difference": -0.2, "has_interval": True,
          "lower": -0.3, "upper": -0.1, "margin": 0.05, "regressed": m == "accuracy",
          "subject_count": 20, "too_few_subjects": False,
          "mcnemar_p_value": 0.004 if m == "accuracy" else math.nan}
         for m in ("accuracy", "abstention_rate")]
    )  # fmt: skip
    r = views.regressions_table(diffs).frame
    assert list(r["Metric"]) == ["Accuracy"]  # only headline metrics are shown
    assert r.iloc[0]["Change"] == "-0.200 [-0.30, -0.10]"
    assert (r.iloc[0]["Regressed"], r.iloc[0]["McNemar p"]) == ("yes", "0.004")


def test_answer_token_probability_beside_stated_confidence(
    tmp_path: Path, benchmark_root: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model that offers log-probabilities gets the comparison table; the tiny hf model does."""
    stack = Stack(tmp_path / "stack", benchmark_root)
    try:
        model = stack.start_model(
            "hf", "hf", ["--model-path", str(tiny_model_dir), "--model-name", "tiny-llava",
                         "--torch-threads", "1"],
        )  # fmt: skip
        gateway = stack.start_gateway()
        grader = stack.start_grader(gateway, extra=["--bootstrap-resamples", "100"])
        api = gateway_stub(gateway.address)
        register(api, "tiny", model.address, concurrency=8)
        run = api.StartRun(
            gw.StartRunRequest(endpoint_name="tiny", benchmark="brain-mri-small"), timeout=10
        ).run
        assert wait_run(api, run.run_id).state == gw.RUN_STATE_SUCCEEDED
        wait_graded(grader_stub(grader.address), [run.run_id])
        at = render(monkeypatch, grader.address, gateway.address)
        assert any("answer-token probability" in h.value for h in at.header)
        compare = table(at, "figure", "stated confidence", "answer-token probability")
        assert list(compare["figure"]) == ["mean confidence", "accuracy", "ECE", "Brier",
                                           "AUROC (right vs wrong)"]  # fmt: skip
        accuracy = compare[compare["figure"] == "accuracy"].iloc[0]
        assert accuracy["answer-token probability"] != "n/a"
    finally:
        stack.stop("grader")
        stack.close()
