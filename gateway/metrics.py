"""The gateway's Prometheus series. Labels name endpoints and outcomes, never items."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class GatewayMetrics:
    """One registry per gateway process (no global state)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.requests = Counter(
            "vigil_gateway_requests",
            "Model requests by endpoint and recorded outcome.",
            ["endpoint", "outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "vigil_gateway_request_latency_seconds",
            "Latency of model requests, from first attempt to recorded outcome.",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.run_completed = Gauge(
            "vigil_gateway_run_completed_items",
            "Items with a recorded response in the endpoint's latest run.",
            ["endpoint"],
            registry=self.registry,
        )
        self.run_total = Gauge(
            "vigil_gateway_run_total_items",
            "Items in the endpoint's latest run.",
            ["endpoint"],
            registry=self.registry,
        )
        self.active_runs = Gauge(
            "vigil_gateway_active_runs", "Runs replaying now.", registry=self.registry
        )
        self.runs_finished = Counter(
            "vigil_gateway_runs_finished",
            "Runs that ended, by endpoint and end state.",
            ["endpoint", "state"],
            registry=self.registry,
        )
