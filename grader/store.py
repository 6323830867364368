"""The grader's DuckDB file: graded rows, the stream position, runs, figures and alerts.

Graded rows and the stream position are written in one transaction, so a restart neither loses
nor double-counts a response. Everything here is derived from the gateway's log: deleting the
file and replaying from sequence 0 gives identical figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pandas as pd

SCHEMA = """
CREATE TABLE IF NOT EXISTS position (id INTEGER PRIMARY KEY, last_seq BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS graded (
    seq BIGINT PRIMARY KEY,
    run_id VARCHAR NOT NULL,
    model_name VARCHAR NOT NULL,
    model_version VARCHAR NOT NULL,
    endpoint_name VARCHAR NOT NULL,
    benchmark_id VARCHAR NOT NULL,
    benchmark_hash VARCHAR NOT NULL,
    item_id VARCHAR NOT NULL,
    subject_id VARCHAR NOT NULL,
    task VARCHAR NOT NULL,
    format VARCHAR NOT NULL,
    phrasing VARCHAR NOT NULL,
    image_mode VARCHAR NOT NULL,
    is_control BOOLEAN NOT NULL,
    plane VARCHAR NOT NULL,
    sequence VARCHAR NOT NULL,
    modality VARCHAR NOT NULL,
    anatomy VARCHAR NOT NULL,
    dataset VARCHAR NOT NULL,
    gateway_outcome VARCHAR NOT NULL,
    outcome VARCHAR NOT NULL,
    reason VARCHAR NOT NULL,
    letter VARCHAR NOT NULL,
    confidence INTEGER NOT NULL,
    correct BOOLEAN NOT NULL,
    true_class VARCHAR NOT NULL,
    pred_class VARCHAR NOT NULL,
    start_time TIMESTAMPTZ NOT NULL,
    latency_s DOUBLE NOT NULL
);
CREATE TABLE IF NOT EXISTS runs (
    run_id VARCHAR PRIMARY KEY,
    model_name VARCHAR NOT NULL,
    model_version VARCHAR NOT NULL,
    endpoint_name VARCHAR NOT NULL,
    benchmark_id VARCHAR NOT NULL,
    benchmark_hash VARCHAR NOT NULL,
    state VARCHAR NOT NULL,
    final BOOLEAN NOT NULL,
    start_time TIMESTAMPTZ NOT NULL,
    end_time TIMESTAMPTZ
);
CREATE TABLE IF NOT EXISTS metrics (
    run_id VARCHAR NOT NULL,
    model_name VARCHAR NOT NULL,
    task VARCHAR NOT NULL,
    format VARCHAR NOT NULL,
    group_axis VARCHAR NOT NULL,
    group_value VARCHAR NOT NULL,
    metric VARCHAR NOT NULL,
    value DOUBLE,
    has_interval BOOLEAN NOT NULL,
    lower DOUBLE,
    upper DOUBLE,
    response_count BIGINT NOT NULL,
    subject_count BIGINT NOT NULL,
    too_few_subjects BOOLEAN NOT NULL,
    final BOOLEAN NOT NULL
);
CREATE TABLE IF NOT EXISTS reliability (
    run_id VARCHAR NOT NULL,
    task VARCHAR NOT NULL,
    format VARCHAR NOT NULL,
    bin INTEGER NOT NULL,
    lower_percent INTEGER NOT NULL,
    upper_percent INTEGER NOT NULL,
    count BIGINT NOT NULL,
    mean_confidence DOUBLE,
    accuracy DOUBLE
);
CREATE TABLE IF NOT EXISTS alerts (
    alert_id VARCHAR PRIMARY KEY,
    kind VARCHAR NOT NULL,
    severity VARCHAR NOT NULL,
    model_name VARCHAR NOT NULL,
    run_id VARCHAR NOT NULL,
    message VARCHAR NOT NULL,
    create_time TIMESTAMPTZ NOT NULL
);
"""

GRADED_COLUMNS = [
    "seq", "run_id", "model_name", "model_version", "endpoint_name", "benchmark_id",
    "benchmark_hash", "item_id", "subject_id", "task", "format", "phrasing", "image_mode",
    "is_control", "plane", "sequence", "modality", "anatomy", "dataset", "gateway_outcome",
    "outcome", "reason", "letter", "confidence", "correct", "true_class", "pred_class",
    "start_time", "latency_s",
]  # fmt: skip

METRIC_COLUMNS = [
    "run_id", "model_name", "task", "format", "group_axis", "group_value", "metric", "value",
    "has_interval", "lower", "upper", "response_count", "subject_count", "too_few_subjects",
    "final",
]  # fmt: skip

RELIABILITY_COLUMNS = [
    "run_id", "task", "format", "bin", "lower_percent", "upper_percent", "count",
    "mean_confidence", "accuracy",
]  # fmt: skip


def utc(value: object) -> datetime | None:
    if value is None or value is pd.NaT:
        return None
    if isinstance(value, pd.Timestamp):
        value = value.to_pydatetime()
    assert isinstance(value, datetime)
    return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)


class GraderStore:
    """Synchronous access to ``grader.duckdb``; used from the grader's event-loop thread only."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.con = duckdb.connect(str(path))
        self.con.execute("SET TimeZone = 'UTC'")
        self.con.execute(SCHEMA)

    def close(self) -> None:
        self.con.close()

    @property
    def last_seq(self) -> int:
        row = self.con.execute("SELECT last_seq FROM position WHERE id = 1").fetchone()
        return int(row[0]) if row else 0

    def graded_count(self) -> int:
        row = self.con.execute("SELECT count(*) FROM graded").fetchone()
        return int(row[0]) if row else 0

    def _insert_df(self, table: str, df: pd.DataFrame, columns: Sequence[str]) -> None:
        if df.empty:
            return
        self.con.register("vigil_batch", df[list(columns)])
        try:
            self.con.execute(f"INSERT INTO {table} SELECT * FROM vigil_batch")
        finally:
            self.con.unregister("vigil_batch")

    def apply_batch(
        self,
        graded: pd.DataFrame,
        runs_seen: Sequence[dict[str, object]],
        run_ends: Sequence[dict[str, object]],
        last_seq: int,
    ) -> None:
        """Store graded rows, new runs and run ends, and the new position, atomically."""
        self.con.execute("BEGIN TRANSACTION")
        try:
            self._insert_df("graded", graded, GRADED_COLUMNS)
            for run in runs_seen:
                self.con.execute(
                    "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, 'running', false, ?, NULL)"
                    " ON CONFLICT (run_id) DO NOTHING",
                    [
                        run["run_id"], run["model_name"], run["model_version"],
                        run["endpoint_name"], run["benchmark_id"], run["benchmark_hash"],
                        run["start_time"],
                    ],
                )  # fmt: skip
            for end in run_ends:
                self.con.execute(
                    "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, true, ?, ?)"
                    " ON CONFLICT (run_id) DO UPDATE SET state = excluded.state, final = true,"
                    " end_time = excluded.end_time",
                    [
                        end["run_id"], end["model_name"], end["model_version"],
                        end["endpoint_name"], end["benchmark_id"], end["benchmark_hash"],
                        end["state"], end["start_time"], end["end_time"],
                    ],
                )  # fmt: skip
            self.con.execute(
                "INSERT INTO position VALUES (1, ?) ON CONFLICT (id) DO UPDATE"
                " SET last_seq = excluded.last_seq",
                [last_seq],
            )
            self.con.execute("COMMIT")
        except Exception:
            self.con.execute("ROLLBACK")
            raise

    def run_rows(self, run_id: str) -> pd.DataFrame:
        return self.con.execute("SELECT * FROM graded WHERE run_id = ? ORDER BY seq", [run_id]).df()

    def replace_figures(
        self,
        run_id: str,
        metrics: pd.DataFrame,
        bins: pd.DataFrame,
        alerts: Sequence[dict[str, object]] = (),
    ) -> None:
        """Replace a run's figures in one transaction (readers never see half of them)."""
        self.con.execute("BEGIN TRANSACTION")
        try:
            self.con.execute("DELETE FROM metrics WHERE run_id = ?", [run_id])
            self.con.execute("DELETE FROM reliability WHERE run_id = ?", [run_id])
            self._insert_df("metrics", metrics, METRIC_COLUMNS)
            self._insert_df("reliability", bins, RELIABILITY_COLUMNS)
            for a in alerts:
                self.con.execute(
                    "INSERT INTO alerts VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (alert_id) DO NOTHING",
                    [
                        a["alert_id"], a["kind"], a["severity"], a["model_name"], a["run_id"],
                        a["message"], a["create_time"],
                    ],
                )  # fmt: skip
            self.con.execute("COMMIT")
        except Exception:
            self.con.execute("ROLLBACK")
            raise

    def get_run(self, run_id: str) -> dict[str, object] | None:
        df = self.list_runs(run_id=run_id)
        return df.iloc[0].to_dict() if len(df) else None

    def list_runs(self, model_name: str = "", run_id: str = "", limit: int = 100) -> pd.DataFrame:
        where, params = [], []
        if model_name:
            where.append("r.model_name = ?")
            params.append(model_name)
        if run_id:
            where.append("r.run_id = ?")
            params.append(run_id)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        return self.con.execute(
            "SELECT r.*, (SELECT count(*) FROM graded g WHERE g.run_id = r.run_id) AS response_count"
            f" FROM runs r {clause} ORDER BY r.start_time DESC, r.run_id DESC LIMIT {int(limit)}",
            params,
        ).df()

    def query_metrics(
        self,
        run_id: str = "",
        model_name: str = "",
        task: str = "",
        fmt: str = "",
        group_axis: str = "",
        metrics: Sequence[str] = (),
        latest_only: bool = False,
    ) -> pd.DataFrame:
        where = ["m.group_axis = ?"]
        params: list[object] = [group_axis]
        for column, value in (("m.run_id", run_id), ("m.model_name", model_name),
                              ("m.task", task), ("m.format", fmt)):  # fmt: skip
            if value:
                where.append(f"{column} = ?")
                params.append(value)
        if metrics:
            where.append(f"m.metric IN ({', '.join('?' for _ in metrics)})")
            params.extend(metrics)
        if latest_only:
            where.append(
                "m.run_id IN (SELECT arg_max(run_id, start_time) FROM runs GROUP BY model_name)"
            )
        return self.con.execute(
            "SELECT m.*, r.start_time AS run_start_time FROM metrics m"
            " JOIN runs r USING (run_id)"
            f" WHERE {' AND '.join(where)}"
            " ORDER BY r.start_time, m.model_name, m.task, m.format, m.group_value, m.metric",
            params,
        ).df()

    def reliability(self, run_id: str, task: str, fmt: str) -> pd.DataFrame:
        return self.con.execute(
            "SELECT * FROM reliability WHERE run_id = ? AND task = ? AND format = ? ORDER BY bin",
            [run_id, task, fmt],
        ).df()

    def list_alerts(self, model_name: str = "") -> pd.DataFrame:
        if model_name:
            return self.con.execute(
                "SELECT * FROM alerts WHERE model_name = ? ORDER BY create_time DESC", [model_name]
            ).df()
        return self.con.execute("SELECT * FROM alerts ORDER BY create_time DESC").df()

    def latest_runs(self) -> pd.DataFrame:
        """Each model's latest run."""
        return self.con.execute(
            "SELECT * FROM runs WHERE run_id IN"
            " (SELECT arg_max(run_id, start_time) FROM runs GROUP BY model_name)"
        ).df()
