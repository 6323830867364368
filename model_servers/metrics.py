"""Prometheus metrics of one model server, on a registry of its own (never the global one)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class ModelMetrics:
    """Request outcomes, generation latency and readiness, labelled by backend only.

    Labels never carry request content: the backend name and a gRPC status code name.
    """

    def __init__(self, registry: CollectorRegistry, backend: str) -> None:
        self.registry = registry
        self.backend = backend
        self._requests = Counter(
            "vigil_model_requests",
            "Generate calls answered, by backend and gRPC status code.",
            ["backend", "code"],
            registry=registry,
        )
        self._latency = Histogram(
            "vigil_model_generate_latency_seconds",
            "Time the backend spent generating one answer.",
            ["backend"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self._ready = Gauge(
            "vigil_model_ready",
            "1 when the model is loaded and the server reports SERVING, else 0.",
            ["backend"],
            registry=registry,
        )
        self._ready.labels(backend).set(0)

    def request(self, code: str) -> None:
        """Count one Generate call that ended with ``code`` (for example "OK")."""
        self._requests.labels(self.backend, code).inc()

    def latency(self, seconds: float) -> None:
        """Record the backend time of one successful generation."""
        self._latency.labels(self.backend).observe(seconds)

    def set_ready(self, ready: bool) -> None:
        """Report whether the model is loaded and answering."""
        self._ready.labels(self.backend).set(1 if ready else 0)


def start_metrics_server(registry: CollectorRegistry, host: str, port: int) -> tuple[Any, int]:
    """Serve ``registry`` over HTTP on ``host:port`` (0 lets the OS choose); the server and port."""
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server, int(server.server_port)


def stop_metrics_server(server: Any) -> None:
    """Stop a server from ``start_metrics_server`` and release its port."""
    server.shutdown()
    server.server_close()
