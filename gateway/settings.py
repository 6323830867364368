"""Gateway settings, read once in ``main()`` from ``VIGIL_GATEWAY_*`` and flags."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def _data_dir() -> Path:
    return Path(os.environ.get("VIGIL_DATA_DIR", "var"))


class GatewaySettings(BaseSettings):
    """How the gateway listens, where it keeps its log, and how hard it pushes endpoints."""

    model_config = SettingsConfigDict(env_prefix="VIGIL_GATEWAY_", extra="forbid")

    host: str = "127.0.0.1"
    """The interface the gRPC server binds."""
    port: int = 50051
    """The gRPC port; 0 lets the OS choose (see ``ready_file``)."""
    metrics_port: int = 9101
    """The Prometheus metrics port; 0 lets the OS choose."""
    db_path: Path = Field(default_factory=lambda: _data_dir() / "gateway.duckdb")
    """The DuckDB file this gateway owns; no other process opens it."""
    benchmark_root: Path = Field(default_factory=lambda: _data_dir() / "benchmarks")
    """Where benchmark folders live."""
    max_concurrency: int = 8
    """Requests in flight per endpoint when the endpoint does not set its own."""
    request_timeout_s: float = 60.0
    """The deadline of one model request when the endpoint does not set its own."""
    describe_timeout_s: float = 5.0
    """The deadline of the DescribeModel call made before a run starts."""
    max_consecutive_errors: int = 25
    """A run fails after this many transport errors or timeouts in a row."""
    max_attempts: int = Field(default=3, ge=1)
    """Attempts per item when the endpoint answers UNAVAILABLE or RESOURCE_EXHAUSTED."""
    retry_backoff_s: float = Field(default=0.2, ge=0.0)
    """The first retry's delay; each further retry doubles it (with jitter)."""
    max_pause_s: float = Field(default=300.0, ge=0.0)
    """How long a run waits, paused, for its endpoint to become ready again before failing."""
    error_budget: float = Field(default=0.2, ge=0.0, le=1.0)
    """A run fails when more than this share of its recorded items are errors..."""
    error_budget_min_items: int = Field(default=50, ge=1)
    """... once at least this many items are recorded."""
    scheduler_tick_s: float = 1.0
    """How often the scheduler looks for due endpoints."""
    ready_file: Path | None = None
    """Where to write the bound ports as JSON once serving (for a parent process)."""
