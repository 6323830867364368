"""The grader's Prometheus series. Labels are model, task, metric and kind: never items."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Counter, Gauge

from grader.store import GraderStore

EXPORTED_METRICS = (
    "coverage", "accuracy", "balanced_accuracy", "ece", "brier", "conf_wrong", "cw_rate",
    "abstention_rate", "unparseable_rate", "transport_error_rate", "macro_f1", "mce", "auroc",
    "aurc", "hallucination_rate", "over_abstention",
)  # fmt: skip


CREDIBILITY_METRICS = ("luck_rate", "shortcut_probability", "rationality")


class GraderExporter:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.metric = Gauge(
            "vigil_grader_metric",
            "Latest figure of each model's latest run (all formats pooled).",
            ["model", "task", "metric"],
            registry=self.registry,
        )
        self.last_seq = Gauge(
            "vigil_grader_last_seq", "Last log sequence number graded.", registry=self.registry
        )
        self.graded = Counter(
            "vigil_grader_graded_responses", "Responses graded.", registry=self.registry
        )
        self.active_alerts = Gauge(
            "vigil_grader_active_alerts",
            "Alerts raised by each model's latest run.",
            ["model", "kind"],
            registry=self.registry,
        )
        self.lag = Gauge(
            "vigil_grader_lag_seconds",
            "Seconds from a response being recorded to it being graded (latest batch).",
            registry=self.registry,
        )
        self.figures_seq = Gauge(
            "vigil_grader_figures_seq",
            "The log position the exported figures include (everything graded up to it).",
            registry=self.registry,
        )
        self.connected = Gauge(
            "vigil_grader_gateway_connected",
            "1 while the grader follows the gateway's stream.",
            registry=self.registry,
        )

    def refresh(self, store: GraderStore) -> None:
        """Re-export the latest run's figures of every model."""
        self.figures_seq.set(store.last_seq)
        latest = store.query_metrics(task="", fmt="all", group_axis="", latest_only=True)
        self.metric.clear()
        for row in latest.itertuples(index=False):
            if (
                row.metric in EXPORTED_METRICS
                and row.value is not None
                and not math.isnan(row.value)
            ):
                self.metric.labels(row.model_name, row.task, row.metric).set(row.value)
        # Credibility and the text-only drop of each model's latest runs, pooled over tasks.
        for row in store.list_credibility(latest_only=True).itertuples(index=False):
            for name in CREDIBILITY_METRICS:
                value = getattr(row, name)
                if value is not None and not math.isnan(value):
                    self.metric.labels(row.model_name, "all", name).set(value)
        drops = store.list_text_only_drops(latest_only=True)
        for row in drops.itertuples(index=False):
            if row.drop is not None and not math.isnan(row.drop):
                self.metric.labels(row.model_name, row.task, "text_only_drop").set(row.drop)
        self.active_alerts.clear()
        runs = store.latest_runs()
        alerts = store.list_alerts()
        for run in runs.itertuples(index=False):
            mine = alerts[alerts["run_id"] == run.run_id] if len(alerts) else alerts
            for kind, count in mine.groupby("kind").size().items() if len(mine) else []:
                self.active_alerts.labels(run.model_name, str(kind)).set(int(count))
