"""Grader settings, read once in ``main()`` from ``VIGIL_GRADER_*`` and flags."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from grader.regressions import ALERT_METRICS


def _data_dir() -> Path:
    return Path(os.environ.get("VIGIL_DATA_DIR", "var"))


class GraderSettings(BaseSettings):
    """Where the grader reads from, where it keeps its figures, and how it computes them."""

    model_config = SettingsConfigDict(env_prefix="VIGIL_GRADER_", extra="forbid")

    host: str = "127.0.0.1"
    """The interface the gRPC server binds."""
    port: int = 50052
    """The gRPC port; 0 lets the OS choose (see ``ready_file``)."""
    metrics_port: int = 9102
    """The Prometheus metrics port; 0 lets the OS choose."""
    gateway_address: str = "127.0.0.1:50051"
    """The gateway whose response log this grader follows."""
    db_path: Path = Field(default_factory=lambda: _data_dir() / "grader.duckdb")
    """The DuckDB file this grader owns; no other process opens it."""
    benchmark_root: Path = Field(default_factory=lambda: _data_dir() / "benchmarks")
    """Where benchmark folders (and their answer keys) live."""
    bootstrap_resamples: int = Field(default=1000, ge=0)
    """Subject-clustered bootstrap resamples for final figures; 0 turns intervals off."""
    bootstrap_seed: int = 0
    """Base seed of the bootstrap; each run's seed also folds in its run id."""
    min_subjects: int = Field(default=5, ge=2)
    """Groups with fewer distinct subjects get no interval and are flagged."""
    refresh_interval_s: float = 1.0
    """How often in-flight runs' point figures are recomputed."""
    transport_error_alert_rate: float = 0.05
    """A finished run whose transport-error rate exceeds this raises an alert."""
    regression_margin: float = Field(default=0.05, ge=0.0)
    """A run regresses on a metric only when the change against the model's previous run exceeds
    this (and the paired 95% interval excludes zero in the bad direction)."""
    regression_margins: dict[str, float] = Field(default_factory=dict)
    """Per-metric margins overriding ``regression_margin``, e.g. ``{"ece": 0.03}`` (JSON)."""
    regression_alert_metrics: tuple[str, ...] = ALERT_METRICS
    """The metrics whose regressions raise alerts (others are compared and stored only)."""
    ready_file: Path | None = None
    """Where to write the bound ports as JSON once serving (for a parent process)."""
