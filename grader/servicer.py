"""``GraderService``: converts protobuf to queries on the grader's store and back."""

from __future__ import annotations

import asyncio
import math

import grpc
import pandas as pd
from google.protobuf.timestamp_pb2 import Timestamp

from grader.credibility import shortcut_correlation
from grader.pipeline import Grader
from grader.regressions import MCNEMAR_METHOD, compare_runs, comparison_frame
from grader.store import utc
from rpc.errors import InvalidArgument, NotFound
from vigil.grader.v1 import grader_pb2 as pb
from vigil.grader.v1 import grader_pb2_grpc

_SEVERITY = {"warning": pb.SEVERITY_WARNING, "critical": pb.SEVERITY_CRITICAL}
_DIRECTION = {1: pb.DIRECTION_HIGHER_IS_BETTER, -1: pb.DIRECTION_LOWER_IS_BETTER}


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


def _interval(has: object, lower: object, upper: object) -> pb.Interval:
    if not bool(has) or _na(lower) or _na(upper):
        return pb.Interval(has_interval=False, lower=math.nan, upper=math.nan)
    return pb.Interval(has_interval=True, lower=_f(lower), upper=_f(upper))


def credibility_message(r: dict[str, object]) -> pb.RunCredibility:
    """One row of the store's ``credibility`` table as a message."""
    has = r["has_interval"]
    return pb.RunCredibility(
        run_id=str(r["run_id"]), model_name=str(r["model_name"]),
        benchmark_hash=str(r["benchmark_hash"]), image_mode=str(r["image_mode"]),
        image_count=int(r["image_count"]), pair_count=int(r["pair_count"]),  # type: ignore[call-overload]
        a_count=int(r["a_count"]), b_count=int(r["b_count"]),  # type: ignore[call-overload]
        c_count=int(r["c_count"]), d_count=int(r["d_count"]),  # type: ignore[call-overload]
        luck_rate=_f(r["luck_rate"]),
        luck_rate_interval=_interval(has, r["luck_lower"], r["luck_upper"]),
        shortcut_probability=_f(r["shortcut_probability"]),
        shortcut_probability_interval=_interval(has, r["shortcut_lower"], r["shortcut_upper"]),
        rationality=_f(r["rationality"]),
        rationality_interval=_interval(has, r["rationality_lower"], r["rationality_upper"]),
        high_level_accuracy=_f(r["high_level_accuracy"]),
        low_level_accuracy=_f(r["low_level_accuracy"]),
        subject_count=int(r["subject_count"]),  # type: ignore[call-overload]
        too_few_subjects=bool(r["too_few_subjects"]), final=bool(r["final"]),
        run_start_time=_ts(r.get("run_start_time")),
    )  # fmt: skip


def comparison_messages(
    df: pd.DataFrame, runs: dict[str, dict[str, object]]
) -> list[pb.RunComparison]:
    """Rows of the store's ``regressions`` table (or ``comparison_frame``), one message a pair."""
    out: list[pb.RunComparison] = []
    if df.empty:
        return out
    for (run_id, base_run_id), part in df.groupby(["run_id", "base_run_id"], sort=False):
        run = runs.get(str(run_id), {})
        part = part.assign(_pooled=part["task"] != "all").sort_values(["_pooled", "task", "metric"])
        pooled = part[part["task"] == "all"]
        first = (pooled if len(pooled) else part).iloc[0]
        diffs = []
        for r in part.to_dict("records"):
            test = None
            if not _na(r.get("mcnemar_statistic")):
                test = pb.McNemarTest(
                    statistic=_f(r["mcnemar_statistic"]), p_value=_f(r["mcnemar_p_value"]),
                    base_only_count=int(r["mcnemar_base_only_count"]),
                    new_only_count=int(r["mcnemar_new_only_count"]),
                    pair_count=int(r["mcnemar_pair_count"]),
                    cluster_count=int(r["mcnemar_cluster_count"]), method=MCNEMAR_METHOD,
                )  # fmt: skip
            diffs.append(
                pb.MetricDifference(
                    task=r["task"], metric=r["metric"], base_value=_f(r["base_value"]),
                    value=_f(r["value"]), difference=_f(r["difference"]),
                    difference_interval=_interval(r["has_interval"], r["lower"], r["upper"]),
                    direction=_DIRECTION.get(int(r["direction"]), pb.DIRECTION_UNSPECIFIED),
                    margin=_f(r["margin"]), regressed=bool(r["regressed"]),
                    subject_count=int(r["subject_count"]),
                    too_few_subjects=bool(r["too_few_subjects"]), mcnemar=test,
                )
            )  # fmt: skip
        out.append(
            pb.RunComparison(
                base_run_id=str(base_run_id), run_id=str(run_id),
                model_name=str(run.get("model_name", first.get("model_name", ""))),
                benchmark_hash=str(run.get("benchmark_hash", "")),
                subject_count=int(first["subject_count"]),
                too_few_subjects=bool(first["too_few_subjects"]), differences=diffs,
                run_start_time=_ts(run.get("start_time")),
            )
        )  # fmt: skip
    return out


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
                    image_mode=str(r.get("image_mode") or "image"),
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

    async def ListCredibility(
        self, request: pb.ListCredibilityRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListCredibilityResponse:
        df = self.store.list_credibility(
            model_name=request.model_name, run_id=request.run_id, latest_only=request.latest_only
        )
        return pb.ListCredibilityResponse(
            credibilities=[credibility_message(r) for r in df.to_dict("records")]
        )

    async def GetShortcutCorrelation(
        self, request: pb.GetShortcutCorrelationRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetShortcutCorrelationResponse:
        df = self.store.list_credibility(latest_only=True)
        df = df[df["image_mode"] != "text_only"]
        if request.benchmark_hash:
            df = df[df["benchmark_hash"] == request.benchmark_hash]
        out = []
        for benchmark_hash, part in df.groupby("benchmark_hash", sort=True):
            part = part.sort_values("model_name")
            corr = shortcut_correlation(
                part["shortcut_probability"].astype(float).tolist(),
                part["high_level_accuracy"].astype(float).tolist(),
            )
            out.append(
                pb.ShortcutCorrelation(
                    benchmark_hash=str(benchmark_hash), model_count=corr.model_count,
                    has_correlation=corr.has_correlation, r=corr.r, p_value=corr.p_value,
                    note=corr.note,
                    points=[credibility_message(r) for r in part.to_dict("records")],
                )
            )  # fmt: skip
        return pb.GetShortcutCorrelationResponse(correlations=out)

    async def ListTextOnlyDrops(
        self, request: pb.ListTextOnlyDropsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListTextOnlyDropsResponse:
        df = self.store.list_text_only_drops(request.model_name, latest_only=request.latest_only)
        return pb.ListTextOnlyDropsResponse(
            drops=[
                pb.TextOnlyDrop(
                    model_name=r["model_name"], benchmark_hash=r["benchmark_hash"],
                    image_run_id=r["image_run_id"], text_run_id=r["text_run_id"],
                    task=r["task"], image_accuracy=_f(r["image_accuracy"]),
                    text_accuracy=_f(r["text_accuracy"]), drop=_f(r["drop"]),
                    drop_interval=_interval(r["has_interval"], r["lower"], r["upper"]),
                    subject_count=int(r["subject_count"]),
                    too_few_subjects=bool(r["too_few_subjects"]),
                )
                for r in df.to_dict("records")
            ]
        )  # fmt: skip

    def _runs(self, run_ids: object) -> dict[str, dict[str, object]]:
        runs = {}
        for run_id in sorted({str(r) for r in run_ids}):  # type: ignore[attr-defined]
            run = self.store.get_run(run_id)
            if run is not None:
                runs[run_id] = run
        return runs

    async def ListRegressions(
        self, request: pb.ListRegressionsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListRegressionsResponse:
        df = self.store.list_regressions(model_name=request.model_name, run_id=request.run_id)
        if request.regressed_only:
            df = df[df["regressed"].astype(bool)]
        runs = self._runs(df["run_id"].unique()) if len(df) else {}
        return pb.ListRegressionsResponse(comparisons=comparison_messages(df, runs))

    async def CompareRuns(
        self, request: pb.CompareRunsRequest, context: grpc.aio.ServicerContext
    ) -> pb.CompareRunsResponse:
        if not request.base_run_id or not request.run_id:
            raise InvalidArgument("base_run_id and run_id are both required")
        if request.base_run_id == request.run_id:
            raise InvalidArgument("base_run_id and run_id must name two different runs")
        base = self.store.get_run(request.base_run_id)
        run = self.store.get_run(request.run_id)
        for run_id, found in ((request.base_run_id, base), (request.run_id, run)):
            if found is None:
                raise NotFound(f"unknown run {run_id!r}")
        assert base is not None and run is not None
        if base["benchmark_hash"] != run["benchmark_hash"]:
            raise InvalidArgument(
                f"runs {request.base_run_id!r} and {request.run_id!r} replayed different"
                " benchmarks (content hashes differ); only runs on the same items compare"
            )
        cfg = self.grader.settings
        # The rows are read here (the store's thread); the bootstrap runs in a worker thread so
        # that grading goes on meanwhile.
        comparison = await asyncio.to_thread(
            compare_runs,
            self.store.run_rows(request.base_run_id), self.store.run_rows(request.run_id),
            request.base_run_id, request.run_id,
            n_resamples=cfg.bootstrap_resamples, seed=cfg.bootstrap_seed,
            min_subjects=cfg.min_subjects, margins=cfg.regression_margins,
            default_margin=cfg.regression_margin, alert_metrics=cfg.regression_alert_metrics,
        )  # fmt: skip
        frame = comparison_frame(comparison, str(run["model_name"]))
        messages = comparison_messages(frame, {request.run_id: run})
        if messages:
            return pb.CompareRunsResponse(comparison=messages[0])
        return pb.CompareRunsResponse(
            comparison=pb.RunComparison(
                base_run_id=request.base_run_id, run_id=request.run_id,
                model_name=str(run["model_name"]), benchmark_hash=str(run["benchmark_hash"]),
                too_few_subjects=True, run_start_time=_ts(run.get("start_time")),
            )
        )  # fmt: skip
