"""The gateway's domain types: endpoints, runs and log entries, free of protobuf."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime


class RunState(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED)


class Outcome(enum.StrEnum):
    OK = "ok"
    TIMEOUT = "timeout"
    TRANSPORT_ERROR = "transport_error"


@dataclass(frozen=True)
class Endpoint:
    name: str
    address: str
    protocol: str = "vigil"
    schedule_interval_s: float = 0.0
    schedule_benchmark: str = ""
    max_concurrency: int = 0
    request_timeout_s: float = 0.0
    create_time: datetime | None = None
    model_name: str = ""
    model_version: str = ""


@dataclass
class Run:
    run_id: str
    endpoint_name: str
    benchmark_id: str
    benchmark_hash: str
    benchmark_path: str
    state: RunState
    item_count: int
    trigger: str
    create_time: datetime
    completed_count: int = 0
    error_count: int = 0
    error_message: str = ""
    model_name: str = ""
    model_version: str = ""
    start_time: datetime | None = None
    end_time: datetime | None = None
    image_mode: str = "image"


@dataclass(frozen=True)
class ResponseEntry:
    """One recorded response with its provenance (DESIGN.md, "Contracts")."""

    run_id: str
    benchmark_id: str
    benchmark_hash: str
    item_id: str
    format: str
    phrasing: str
    option_order: str
    image_mode: str
    endpoint_name: str
    protocol: str
    model_name: str
    model_version: str
    request_id: str
    start_time: datetime
    latency_s: float
    attempt_count: int
    outcome: Outcome
    raw_text: str
    error_message: str
    vigil_version: str
    model_config_digest: str = ""
    # The generated tokens' log-probabilities as JSON [[token, logprob], ...]; "" when not offered.
    logprobs_json: str = ""
    # Earlier attempts that failed and were retried: (attempt, start, latency_s, outcome, error).
    failed_attempts: tuple[tuple[int, datetime, float, str, str], ...] = ()
    seq: int = 0


@dataclass(frozen=True)
class RunEndEntry:
    """A run's end, written into the log so that followers know its figures are final."""

    run: Run
    seq: int = 0


LogEntry = ResponseEntry | RunEndEntry


@dataclass
class RunProgress:
    """Counters of a live run, kept in memory for WatchRun and the metrics."""

    completed: int = 0
    errors: int = 0
    consecutive_errors: int = 0
    waiters: list = field(default_factory=list)
