"""``GraderService``: converts protobuf to queries on the grader's store and back."""

from __future__ import annotations

import math

import grpc
import pandas as pd
from google.protobuf.timestamp_pb2 import Timestamp

from grader.pipeline import Grader
from grader.store import utc
from rpc.errors import InvalidArgument, NotFound
from vigil.grader.v1 import grader_pb2 as pb
from vigil.grader.v1 import grader_pb2_grpc

_SEVERITY = {"warning": pb.SEVERITY_WARNING, "critical": pb.SEVERITY_CRITICAL}


def _ts(value: object) -> Timestamp | None:
    when = utc(value)
    if when is None:
        return None
    ts = Timestamp()
    ts.FromDatetime(when)
    return ts


def _f(value: object) -> float:
    if value is None:
        return math.nan
    try:
        f = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan
    return f


def _na(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NaT


class GraderServicer(grader_pb2_grpc.GraderServiceServicer):
    def __init__(self, grader: Grader) -> None:
        self.grader = grader
        self.store = grader.store

    async def ListGradedRuns(
        self, request: pb.ListGradedRunsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListGradedRunsResponse:
        if request.page_size < 0:
            raise InvalidArgument("page_size must not be negative")
        df = self.store.list_runs(model_name=request.model_name, limit=request.page_size or 100)
        return pb.ListGradedRunsResponse(
            runs=[
                pb.GradedRun(
                    run_id=r["run_id"],
                    model_name=r["model_name"],
                    model_version=r["model_version"],
                    endpoint_name=r["endpoint_name"],
                    benchmark_id=r["benchmark_id"],
                    benchmark_hash=r["benchmark_hash"],
                    response_count=int(r["response_count"]),
                    final=bool(r["final"]),
                    state=r["state"],
                    start_time=_ts(r["start_time"]),
                )
                for r in df.to_dict("records")
            ]
        )

    async def QueryMetrics(
        self, request: pb.QueryMetricsRequest, context: grpc.aio.ServicerContext
    ) -> pb.QueryMetricsResponse:
        if request.run_id and self.store.get_run(request.run_id) is None:
            raise NotFound(f"unknown run {request.run_id!r}")
        df = self.store.query_metrics(
            run_id=request.run_id,
            model_name=request.model_name,
            task=request.task,
            fmt=request.format,
            group_axis=request.group_axis,
            metrics=list(request.metrics),
            latest_only=request.latest_only,
        )
        return pb.QueryMetricsResponse(
            values=[
                pb.MetricValue(
                    run_id=r["run_id"],
                    model_name=r["model_name"],
                    task=r["task"],
                    format=r["format"],
                    group_axis=r["group_axis"],
                    group_value=r["group_value"],
                    metric=r["metric"],
                    value=_f(r["value"]),
                    has_interval=bool(r["has_interval"]),
                    lower=_f(r["lower"]),
                    upper=_f(r["upper"]),
                    response_count=int(r["response_count"]),
                    subject_count=int(r["subject_count"]),
                    too_few_subjects=bool(r["too_few_subjects"]),
                    final=bool(r["final"]),
                    run_start_time=_ts(r["run_start_time"]),
                )
                for r in df.to_dict("records")
            ]
        )

    async def GetTrend(
        self, request: pb.GetTrendRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetTrendResponse:
        if not request.metric:
            raise InvalidArgument("metric is required")
        df = self.store.query_metrics(
            task=request.task or "all", fmt=request.format or "all", metrics=[request.metric]
        )
        if request.model_names:
            df = df[df["model_name"].isin(list(request.model_names))]
        return pb.GetTrendResponse(
            points=[
                pb.TrendPoint(
                    run_id=r["run_id"],
                    model_name=r["model_name"],
                    run_start_time=_ts(r["run_start_time"]),
                    value=_f(r["value"]),
                    has_interval=bool(r["has_interval"]),
                    lower=_f(r["lower"]),
                    upper=_f(r["upper"]),
                    final=bool(r["final"]),
                )
                for r in df.to_dict("records")
            ]
        )

    async def GetReliabilityDiagram(
        self, request: pb.GetReliabilityDiagramRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetReliabilityDiagramResponse:
        run = self.store.get_run(request.run_id)
        if run is None:
            raise NotFound(f"unknown run {request.run_id!r}")
        df = self.store.reliability(request.run_id, request.task or "all", request.format or "all")
        return pb.GetReliabilityDiagramResponse(
            model_name=str(run["model_name"]),
            bins=[
                pb.ReliabilityBin(
                    lower_percent=int(r["lower_percent"]),
                    upper_percent=int(r["upper_percent"]),
                    count=int(r["count"]),
                    mean_confidence=math.nan
                    if _na(r["mean_confidence"])
                    else float(r["mean_confidence"]),
                    accuracy=math.nan if _na(r["accuracy"]) else float(r["accuracy"]),
                )
                for r in df.to_dict("records")
            ],
        )

    async def ListAlerts(
        self, request: pb.ListAlertsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListAlertsResponse:
        df = self.store.list_alerts(request.model_name)
        return pb.ListAlertsResponse(
            alerts=[
                pb.Alert(
                    alert_id=r["alert_id"],
                    kind=r["kind"],
                    severity=_SEVERITY.get(r["severity"], pb.SEVERITY_UNSPECIFIED),
                    model_name=r["model_name"],
                    run_id=r["run_id"],
                    message=r["message"],
                    create_time=_ts(r["create_time"]),
                )
                for r in df.to_dict("records")
            ]
        )

    async def GetGraderStatus(
        self, request: pb.GetGraderStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetGraderStatusResponse:
        return pb.GetGraderStatusResponse(
            last_seq=self.store.last_seq,
            graded_count=self.store.graded_count(),
            gateway_connected=self.grader.connected,
        )
