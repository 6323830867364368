"""A thin, read-only client of the grader's and the gateway's gRPC APIs for the dashboard.

Every function takes a :class:`Conn` (one channel to one service, with a deadline) and returns a
pandas DataFrame or a small dataclass; nothing here formats for display (see ``views.py``).
Every call has a deadline. A service that cannot be reached (UNAVAILABLE, DEADLINE_EXCEEDED)
raises :class:`ServiceDown`; any other error status raises :class:`ServiceFailed`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC
from typing import Any

import grpc
import pandas as pd
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from rpc.client import sync_channel
from vigil.gateway.v1 import gateway_pb2 as gw
from vigil.gateway.v1 import gateway_pb2_grpc
from vigil.grader.v1 import grader_pb2 as gr
from vigil.grader.v1 import grader_pb2_grpc

GRADER = "grader"
GATEWAY = "gateway"

#: Statuses that mean "the service is not there" rather than "the service said no".
_DOWN_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)

RUN_COLUMNS = [
    "run_id", "model_name", "model_version", "endpoint_name", "benchmark_id", "benchmark_hash",
    "response_count", "final", "state", "start_time",
]  # fmt: skip
METRIC_COLUMNS = [
    "run_id", "model_name", "task", "format", "group_axis", "group_value", "metric", "value",
    "has_interval", "lower", "upper", "response_count", "subject_count", "too_few_subjects",
    "final", "run_start_time",
]  # fmt: skip
TREND_COLUMNS = [
    "run_id", "model_name", "run_start_time", "value", "has_interval", "lower", "upper", "final",
]  # fmt: skip
BIN_COLUMNS = ["lower_percent", "upper_percent", "count", "mean_confidence", "accuracy"]
ALERT_COLUMNS = [
    "alert_id", "kind", "severity", "model_name", "run_id", "message", "create_time",
]  # fmt: skip
ENDPOINT_COLUMNS = [
    "name", "address", "protocol", "schedule_interval_s", "schedule_benchmark",
    "max_concurrency", "request_timeout_s", "create_time",
]  # fmt: skip
GATEWAY_RUN_COLUMNS = [
    "run_id", "endpoint_name", "benchmark_id", "benchmark_hash", "state", "item_count",
    "completed_count", "error_count", "error_message", "trigger", "model_name", "model_version",
    "create_time", "start_time", "end_time",
]  # fmt: skip


class ClientError(Exception):
    """A call to one of Vigil's services failed."""

    def __init__(self, service: str, address: str, detail: str) -> None:
        super().__init__(service, address, detail)
        self.service = service
        self.address = address
        self.detail = detail


class ServiceDown(ClientError):
    """The service could not be reached (not listening, unreachable, or past the deadline)."""

    def __str__(self) -> str:
        return f"The {self.service} at {self.address} is not reachable ({self.detail})."


class ServiceFailed(ClientError):
    """The service answered with an error status."""

    def __str__(self) -> str:
        return f"The {self.service} at {self.address} answered with an error ({self.detail})."


@dataclass
class Conn:
    """One channel to one service, with the deadline every call on it gets."""

    service: str
    address: str
    channel: grpc.Channel
    timeout_s: float

    def call(self, stub: Any, method: str, request: Message) -> Any:
        try:
            return getattr(stub, method)(request, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
            details = exc.details() if hasattr(exc, "details") else str(exc)
            detail = f"{method}: {code.name}: {details}" if details else f"{method}: {code.name}"
            if code in _DOWN_CODES:
                raise ServiceDown(self.service, self.address, detail) from None
            raise ServiceFailed(self.service, self.address, detail) from None


@contextmanager
def connect(service: str, address: str, timeout_s: float) -> Iterator[Conn]:
    """A channel to ``service`` at ``address`` for the duration of one page render.

    A fresh channel per render means a service that comes back is seen on the next refresh,
    instead of after gRPC's reconnect backoff on a long-lived channel.
    """
    channel = sync_channel(address)
    try:
        yield Conn(service, address, channel, timeout_s)
    finally:
        channel.close()


def _grader(conn: Conn) -> grader_pb2_grpc.GraderServiceStub:
    return grader_pb2_grpc.GraderServiceStub(conn.channel)


def _gateway(conn: Conn) -> gateway_pb2_grpc.GatewayServiceStub:
    return gateway_pb2_grpc.GatewayServiceStub(conn.channel)


def _time(msg: Message, name: str) -> pd.Timestamp:
    if not msg.HasField(name):
        return pd.NaT
    ts: Timestamp = getattr(msg, name)
    return pd.Timestamp(ts.ToDatetime(tzinfo=UTC))


def _seconds(msg: Message, name: str) -> float:
    if not msg.HasField(name):
        return 0.0
    d: Duration = getattr(msg, name)
    return d.ToTimedelta().total_seconds()


def _frame(rows: list[dict[str, Any]], columns: Sequence[str]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=list(columns))


def _interval(has: bool, value: float) -> float:
    return value if has else math.nan


# ---- grader -------------------------------------------------------------------------------


@dataclass(frozen=True)
class GraderStatus:
    """How far the grader has read the gateway's log."""

    last_seq: int
    graded_count: int
    gateway_connected: bool


def grader_status(conn: Conn) -> GraderStatus:
    reply = conn.call(_grader(conn), "GetGraderStatus", gr.GetGraderStatusRequest())
    return GraderStatus(reply.last_seq, reply.graded_count, reply.gateway_connected)


def graded_runs(conn: Conn, model_name: str = "", page_size: int = 1000) -> pd.DataFrame:
    """The runs the grader has seen, newest first (``RUN_COLUMNS``)."""
    reply = conn.call(
        _grader(conn),
        "ListGradedRuns",
        gr.ListGradedRunsRequest(model_name=model_name, page_size=page_size),
    )
    return _frame(
        [
            {
                "run_id": r.run_id,
                "model_name": r.model_name,
                "model_version": r.model_version,
                "endpoint_name": r.endpoint_name,
                "benchmark_id": r.benchmark_id,
                "benchmark_hash": r.benchmark_hash,
                "response_count": r.response_count,
                "final": r.final,
                "state": r.state,
                "start_time": _time(r, "start_time"),
            }
            for r in reply.runs
        ],
        RUN_COLUMNS,
    )


def metric_values(
    conn: Conn,
    *,
    run_id: str = "",
    model_name: str = "",
    task: str = "",
    fmt: str = "",
    group_axis: str = "",
    metrics: Sequence[str] = (),
    latest_only: bool = False,
) -> pd.DataFrame:
    """``QueryMetrics`` as a long table (``METRIC_COLUMNS``); missing interval ends are NaN."""
    reply = conn.call(
        _grader(conn),
        "QueryMetrics",
        gr.QueryMetricsRequest(
            run_id=run_id,
            model_name=model_name,
            task=task,
            format=fmt,
            group_axis=group_axis,
            metrics=list(metrics),
            latest_only=latest_only,
        ),
    )
    return _frame(
        [
            {
                "run_id": v.run_id,
                "model_name": v.model_name,
                "task": v.task,
                "format": v.format,
                "group_axis": v.group_axis,
                "group_value": v.group_value,
                "metric": v.metric,
                "value": v.value,
                "has_interval": v.has_interval,
                "lower": _interval(v.has_interval, v.lower),
                "upper": _interval(v.has_interval, v.upper),
                "response_count": v.response_count,
                "subject_count": v.subject_count,
                "too_few_subjects": v.too_few_subjects,
                "final": v.final,
                "run_start_time": _time(v, "run_start_time"),
            }
            for v in reply.values
        ],
        METRIC_COLUMNS,
    )


@dataclass(frozen=True)
class Fleet:
    """Each model's latest run and that run's pooled figures (task "all", format "all")."""

    runs: pd.DataFrame
    """One row per model (``RUN_COLUMNS``), newest run first."""
    metrics: pd.DataFrame
    """The runs' pooled figures, long (``METRIC_COLUMNS``)."""


def fleet(conn: Conn) -> Fleet:
    """The latest run of every model with its pooled figures."""
    metrics = metric_values(conn, task="all", fmt="all", group_axis="", latest_only=True)
    runs = graded_runs(conn)
    latest = runs.drop_duplicates("model_name", keep="first")  # newest first
    # A model whose latest run is older than the page of runs listed: ask for it by name.
    missing = sorted(set(metrics["model_name"]) - set(latest["model_name"]))
    extra = [graded_runs(conn, model_name=m, page_size=1) for m in missing]
    if extra:
        latest = pd.concat([latest, *extra], ignore_index=True)
    latest = latest.sort_values(
        ["start_time", "model_name"], ascending=[False, True], na_position="last"
    )
    return Fleet(runs=latest.reset_index(drop=True), metrics=metrics)


def run_breakdown(conn: Conn, run_id: str) -> pd.DataFrame:
    """Every (task, format) figure of one run, no further grouping (``METRIC_COLUMNS``)."""
    return metric_values(conn, run_id=run_id, group_axis="")


def trend(
    conn: Conn, metric: str, model_names: Sequence[str] = (), task: str = "", fmt: str = ""
) -> pd.DataFrame:
    """One metric over runs, oldest first (``TREND_COLUMNS``)."""
    reply = conn.call(
        _grader(conn),
        "GetTrend",
        gr.GetTrendRequest(metric=metric, model_names=list(model_names), task=task, format=fmt),
    )
    return _frame(
        [
            {
                "run_id": p.run_id,
                "model_name": p.model_name,
                "run_start_time": _time(p, "run_start_time"),
                "value": p.value,
                "has_interval": p.has_interval,
                "lower": _interval(p.has_interval, p.lower),
                "upper": _interval(p.has_interval, p.upper),
                "final": p.final,
            }
            for p in reply.points
        ],
        TREND_COLUMNS,
    )


def reliability(conn: Conn, run_id: str, task: str = "", fmt: str = "") -> pd.DataFrame:
    """The run's ten confidence bins, lowest first (``BIN_COLUMNS``)."""
    reply = conn.call(
        _grader(conn),
        "GetReliabilityDiagram",
        gr.GetReliabilityDiagramRequest(run_id=run_id, task=task, format=fmt),
    )
    return _frame(
        [
            {
                "lower_percent": b.lower_percent,
                "upper_percent": b.upper_percent,
                "count": b.count,
                "mean_confidence": b.mean_confidence,
                "accuracy": b.accuracy,
            }
            for b in reply.bins
        ],
        BIN_COLUMNS,
    )


_SEVERITY = {gr.SEVERITY_WARNING: "warning", gr.SEVERITY_CRITICAL: "critical"}


def alerts(conn: Conn, model_name: str = "") -> pd.DataFrame:
    """Stored alerts, newest first (``ALERT_COLUMNS``); severity as "warning" / "critical"."""
    reply = conn.call(_grader(conn), "ListAlerts", gr.ListAlertsRequest(model_name=model_name))
    return _frame(
        [
            {
                "alert_id": a.alert_id,
                "kind": a.kind,
                "severity": _SEVERITY.get(a.severity, "unspecified"),
                "model_name": a.model_name,
                "run_id": a.run_id,
                "message": a.message,
                "create_time": _time(a, "create_time"),
            }
            for a in reply.alerts
        ],
        ALERT_COLUMNS,
    )


# ---- gateway ------------------------------------------------------------------------------

_PROTOCOL = {gw.PROTOCOL_VIGIL: "vigil"}
_RUN_STATE = {
    gw.RUN_STATE_PENDING: "pending",
    gw.RUN_STATE_RUNNING: "running",
    gw.RUN_STATE_SUCCEEDED: "succeeded",
    gw.RUN_STATE_FAILED: "failed",
    gw.RUN_STATE_CANCELLED: "cancelled",
}


def endpoints(conn: Conn) -> pd.DataFrame:
    """The gateway's registered endpoints (``ENDPOINT_COLUMNS``)."""
    reply = conn.call(_gateway(conn), "ListEndpoints", gw.ListEndpointsRequest())
    return _frame(
        [
            {
                "name": e.name,
                "address": e.address,
                "protocol": _PROTOCOL.get(e.protocol, gw.Protocol.Name(e.protocol)),
                "schedule_interval_s": _seconds(e, "schedule_interval"),
                "schedule_benchmark": e.schedule_benchmark,
                "max_concurrency": e.max_concurrency,
                "request_timeout_s": _seconds(e, "request_timeout"),
                "create_time": _time(e, "create_time"),
            }
            for e in reply.endpoints
        ],
        ENDPOINT_COLUMNS,
    )


def gateway_runs(conn: Conn, endpoint_name: str = "", page_size: int = 50) -> pd.DataFrame:
    """The gateway's runs, newest first (``GATEWAY_RUN_COLUMNS``); state as a lower-case word."""
    reply = conn.call(
        _gateway(conn),
        "ListRuns",
        gw.ListRunsRequest(endpoint_name=endpoint_name, page_size=page_size),
    )
    return _frame(
        [
            {
                "run_id": r.run_id,
                "endpoint_name": r.endpoint_name,
                "benchmark_id": r.benchmark_id,
                "benchmark_hash": r.benchmark_hash,
                "state": _RUN_STATE.get(r.state, "unspecified"),
                "item_count": r.item_count,
                "completed_count": r.completed_count,
                "error_count": r.error_count,
                "error_message": r.error_message,
                "trigger": r.trigger,
                "model_name": r.model_name,
                "model_version": r.model_version,
                "create_time": _time(r, "create_time"),
                "start_time": _time(r, "start_time"),
                "end_time": _time(r, "end_time"),
            }
            for r in reply.runs
        ],
        GATEWAY_RUN_COLUMNS,
    )


# ---- grader: credibility, text-only drops, regressions --------------------------------------

CREDIBILITY_COLUMNS = [
    "run_id", "model_name", "benchmark_hash", "image_mode", "image_count", "pair_count",
    "a_count", "b_count", "c_count", "d_count", "luck_rate", "luck_lower", "luck_upper",
    "shortcut_probability", "shortcut_lower", "shortcut_upper", "rationality",
    "rationality_lower", "rationality_upper", "has_interval", "high_level_accuracy",
    "low_level_accuracy", "subject_count", "too_few_subjects", "final", "run_start_time",
]  # fmt: skip
CORRELATION_COLUMNS = ["benchmark_hash", "model_count", "has_correlation", "r", "p_value", "note"]
DROP_COLUMNS = [
    "model_name", "benchmark_hash", "image_run_id", "text_run_id", "task", "image_accuracy",
    "text_accuracy", "drop", "has_interval", "lower", "upper", "subject_count",
    "too_few_subjects",
]  # fmt: skip
REGRESSION_COLUMNS = [
    "run_id", "base_run_id", "model_name", "task", "metric", "base_value", "value",
    "difference", "has_interval", "lower", "upper", "margin", "regressed", "subject_count",
    "too_few_subjects", "mcnemar_p_value",
]  # fmt: skip


def _credibility_row(c: gr.RunCredibility) -> dict[str, Any]:
    def ends(i: gr.Interval) -> tuple[float, float]:
        return _interval(i.has_interval, i.lower), _interval(i.has_interval, i.upper)

    luck, shortcut, rational = (
        ends(c.luck_rate_interval), ends(c.shortcut_probability_interval),
        ends(c.rationality_interval),
    )  # fmt: skip
    return {
        "run_id": c.run_id, "model_name": c.model_name, "benchmark_hash": c.benchmark_hash,
        "image_mode": c.image_mode, "image_count": c.image_count, "pair_count": c.pair_count,
        "a_count": c.a_count, "b_count": c.b_count, "c_count": c.c_count, "d_count": c.d_count,
        "luck_rate": c.luck_rate, "luck_lower": luck[0], "luck_upper": luck[1],
        "shortcut_probability": c.shortcut_probability, "shortcut_lower": shortcut[0],
        "shortcut_upper": shortcut[1], "rationality": c.rationality,
        "rationality_lower": rational[0], "rationality_upper": rational[1],
        "has_interval": c.shortcut_probability_interval.has_interval,
        "high_level_accuracy": c.high_level_accuracy, "low_level_accuracy": c.low_level_accuracy,
        "subject_count": c.subject_count, "too_few_subjects": c.too_few_subjects,
        "final": c.final, "run_start_time": _time(c, "run_start_time"),
    }  # fmt: skip


def credibility(conn: Conn, model_name: str = "", latest_only: bool = True) -> pd.DataFrame:
    """MedRCube's credibility figures per run, newest first (``CREDIBILITY_COLUMNS``)."""
    reply = conn.call(
        _grader(conn),
        "ListCredibility",
        gr.ListCredibilityRequest(model_name=model_name, latest_only=latest_only),
    )
    return _frame([_credibility_row(c) for c in reply.credibilities], CREDIBILITY_COLUMNS)


def shortcut_correlations(conn: Conn) -> pd.DataFrame:
    """Per benchmark: Pearson's r of shortcut probability with high-level accuracy across
    models (``CORRELATION_COLUMNS``)."""
    reply = conn.call(_grader(conn), "GetShortcutCorrelation", gr.GetShortcutCorrelationRequest())
    return _frame(
        [
            {"benchmark_hash": c.benchmark_hash, "model_count": c.model_count,
             "has_correlation": c.has_correlation, "r": c.r, "p_value": c.p_value,
             "note": c.note}
            for c in reply.correlations
        ],
        CORRELATION_COLUMNS,
    )  # fmt: skip


def text_only_drops(conn: Conn, model_name: str = "", latest_only: bool = True) -> pd.DataFrame:
    """Accuracy with images minus accuracy without, per model and task (``DROP_COLUMNS``)."""
    reply = conn.call(
        _grader(conn),
        "ListTextOnlyDrops",
        gr.ListTextOnlyDropsRequest(model_name=model_name, latest_only=latest_only),
    )
    return _frame(
        [
            {"model_name": d.model_name, "benchmark_hash": d.benchmark_hash,
             "image_run_id": d.image_run_id, "text_run_id": d.text_run_id, "task": d.task,
             "image_accuracy": d.image_accuracy, "text_accuracy": d.text_accuracy,
             "drop": d.drop, "has_interval": d.drop_interval.has_interval,
             "lower": _interval(d.drop_interval.has_interval, d.drop_interval.lower),
             "upper": _interval(d.drop_interval.has_interval, d.drop_interval.upper),
             "subject_count": d.subject_count, "too_few_subjects": d.too_few_subjects}
            for d in reply.drops
        ],
        DROP_COLUMNS,
    )  # fmt: skip


def regressions(conn: Conn, model_name: str = "", run_id: str = "") -> pd.DataFrame:
    """Each run against its model's previous run, one row per task and metric
    (``REGRESSION_COLUMNS``), newest run first."""
    reply = conn.call(
        _grader(conn),
        "ListRegressions",
        gr.ListRegressionsRequest(model_name=model_name, run_id=run_id),
    )
    return _frame(
        [
            {"run_id": c.run_id, "base_run_id": c.base_run_id, "model_name": c.model_name,
             "task": d.task, "metric": d.metric, "base_value": d.base_value, "value": d.value,
             "difference": d.difference, "has_interval": d.difference_interval.has_interval,
             "lower": _interval(d.difference_interval.has_interval, d.difference_interval.lower),
             "upper": _interval(d.difference_interval.has_interval, d.difference_interval.upper),
             "margin": d.margin, "regressed": d.regressed, "subject_count": d.subject_count,
             "too_few_subjects": d.too_few_subjects,
             "mcnemar_p_value": d.mcnemar.p_value if d.HasField("mcnemar") else math.nan}
            for c in reply.comparisons
            for d in c.differences
        ],
        REGRESSION_COLUMNS,
    )  # fmt: skip
