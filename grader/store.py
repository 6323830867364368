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
CREATE TABLE IF NOT EXISTS credibility (
    run_id VARCHAR PRIMARY KEY,
    model_name VARCHAR NOT NULL,
    benchmark_hash VARCHAR NOT NULL,
    image_mode VARCHAR NOT NULL,
    image_count BIGINT NOT NULL,
    pair_count BIGINT NOT NULL,
    a_count BIGINT NOT NULL,
    b_count BIGINT NOT NULL,
    c_count BIGINT NOT NULL,
    d_count BIGINT NOT NULL,
    luck_rate DOUBLE,
    shortcut_probability DOUBLE,
    rationality DOUBLE,
    has_interval BOOLEAN NOT NULL,
    luck_lower DOUBLE,
    luck_upper DOUBLE,
    shortcut_lower DOUBLE,
    shortcut_upper DOUBLE,
    rationality_lower DOUBLE,
    rationality_upper DOUBLE,
    high_level_accuracy DOUBLE,
    low_level_accuracy DOUBLE,
    subject_count BIGINT NOT NULL,
    too_few_subjects BOOLEAN NOT NULL,
    final BOOLEAN NOT NULL
);
CREATE TABLE IF NOT EXISTS text_only_drops (
    model_name VARCHAR NOT NULL,
    benchmark_hash VARCHAR NOT NULL,
    image_run_id VARCHAR NOT NULL,
    text_run_id VARCHAR NOT NULL,
    task VARCHAR NOT NULL,
    image_accuracy DOUBLE,
    text_accuracy DOUBLE,
    drop DOUBLE,
    has_interval BOOLEAN NOT NULL,
    lower DOUBLE,
    upper DOUBLE,
    subject_count BIGINT NOT NULL,
    too_few_subjects BOOLEAN NOT NULL,
    PRIMARY KEY (image_run_id, text_run_id, task)
);
CREATE TABLE IF NOT EXISTS regressions (
    run_id VARCHAR NOT NULL,
    base_run_id VARCHAR NOT NULL,
    model_name VARCHAR NOT NULL,
    task VARCHAR NOT NULL,
    metric VARCHAR NOT NULL,
    base_value DOUBLE,
    value DOUBLE,
    difference DOUBLE,
    direction INTEGER NOT NULL,
    has_interval BOOLEAN NOT NULL,
    lower DOUBLE,
    upper DOUBLE,
    margin DOUBLE NOT NULL,
    regressed BOOLEAN NOT NULL,
    subject_count BIGINT NOT NULL,
    too_few_subjects BOOLEAN NOT NULL,
    mcnemar_statistic DOUBLE,
    mcnemar_p_value DOUBLE,
    mcnemar_base_only_count BIGINT,
    mcnemar_new_only_count BIGINT,
    mcnemar_pair_count BIGINT,
    mcnemar_cluster_count BIGINT,
    PRIMARY KEY (run_id, base_run_id, task, metric)
);
"""

# Columns added after the first release: an existing grader.duckdb gains them on open (and a
# new file gets them the same way, so both have the same column order).
MIGRATIONS = [
    ("graded", "hierarchy", "VARCHAR DEFAULT ''"),
    ("graded", "laterality", "VARCHAR DEFAULT ''"),
    ("graded", "image_path", "VARCHAR DEFAULT ''"),
    ("graded", "expect_abstain", "BOOLEAN DEFAULT false"),
    ("graded", "hallucinated", "INTEGER DEFAULT -1"),
    # The probability the model gave its answer token, integer percent; -1 when not offered.
    ("graded", "token_confidence", "INTEGER DEFAULT -1"),
    ("runs", "image_mode", "VARCHAR DEFAULT 'image'"),
    # Fixed when a run ends, so that replaying the log pairs the same runs: the model's previous
    # succeeded run on the same items and image mode (for regressions), and its latest succeeded
    # run in the other image mode (for the text-only drop).
    ("runs", "base_run_id", "VARCHAR DEFAULT ''"),
    ("runs", "pair_run_id", "VARCHAR DEFAULT ''"),
]

_BASE_RUN = (
    "SELECT run_id FROM runs WHERE model_name = ? AND benchmark_hash = ? AND image_mode = ?"
    " AND state = 'succeeded' AND run_id <> ?"
    " AND (start_time < ? OR (start_time = ? AND run_id < ?))"
    " ORDER BY start_time DESC, run_id DESC LIMIT 1"
)
_PAIR_RUN = (
    "SELECT run_id FROM runs WHERE model_name = ? AND benchmark_hash = ? AND image_mode = ?"
    " AND state = 'succeeded' ORDER BY start_time DESC, run_id DESC LIMIT 1"
)

GRADED_COLUMNS = [
    "seq", "run_id", "model_name", "model_version", "endpoint_name", "benchmark_id",
    "benchmark_hash", "item_id", "subject_id", "task", "format", "phrasing", "image_mode",
    "is_control", "plane", "sequence", "modality", "anatomy", "dataset", "gateway_outcome",
    "outcome", "reason", "letter", "confidence", "correct", "true_class", "pred_class",
    "start_time", "latency_s", "hierarchy", "laterality", "image_path", "expect_abstain",
    "hallucinated", "token_confidence",
]  # fmt: skip

METRIC_COLUMNS = [
    "run_id", "model_name", "task", "format", "group_axis", "group_value", "metric", "value",
    "has_interval", "lower", "upper", "response_count", "subject_count", "too_few_subjects",
    "final",
]  # fmt: skip

CREDIBILITY_COLUMNS = [
    "run_id", "model_name", "benchmark_hash", "image_mode", "image_count", "pair_count",
    "a_count", "b_count", "c_count", "d_count", "luck_rate", "shortcut_probability",
    "rationality", "has_interval", "luck_lower", "luck_upper", "shortcut_lower",
    "shortcut_upper", "rationality_lower", "rationality_upper", "high_level_accuracy",
    "low_level_accuracy", "subject_count", "too_few_subjects", "final",
]  # fmt: skip

DROP_COLUMNS = [
    "model_name", "benchmark_hash", "image_run_id", "text_run_id", "task", "image_accuracy",
    "text_accuracy", "drop", "has_interval", "lower", "upper", "subject_count",
    "too_few_subjects",
]  # fmt: skip

REGRESSION_COLUMNS = [
    "run_id", "base_run_id", "model_name", "task", "metric", "base_value", "value",
    "difference", "direction", "has_interval", "lower", "upper", "margin", "regressed",
    "subject_count", "too_few_subjects", "mcnemar_statistic", "mcnemar_p_value",
    "mcnemar_base_only_count", "mcnemar_new_only_count", "mcnemar_pair_count",
    "mcnemar_cluster_count",
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


# Each model's latest run: its newest run with images, or its newest run when it has none.
LATEST_RUNS = (
    "SELECT arg_max(run_id, [CASE WHEN image_mode = 'text_only' THEN 0 ELSE 1 END,"
    " epoch_us(start_time)]) FROM runs GROUP BY model_name"
)


class GraderStore:
    """Synchronous access to ``grader.duckdb``; used from the grader's event-loop thread only."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.con = duckdb.connect(str(path))
        self.con.execute("SET TimeZone = 'UTC'")
        self.con.execute(SCHEMA)
        for table, column, kind in MIGRATIONS:
            self.con.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {kind}")

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
        names = ", ".join(columns)
        self.con.register("vigil_batch", df[list(columns)])
        try:
            self.con.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM vigil_batch")
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
        if not graded.empty:
            # Rows built without a token probability (older callers) get "none" (-1).
            token = graded.get("token_confidence", pd.Series(-1, index=graded.index))
            graded = graded.assign(
                token_confidence=pd.to_numeric(token, errors="coerce").fillna(-1).astype("int64")
            )
        self.con.execute("BEGIN TRANSACTION")
        try:
            self._insert_df("graded", graded, GRADED_COLUMNS)
            for run in runs_seen:
                self.con.execute(
                    "INSERT INTO runs (run_id, model_name, model_version, endpoint_name,"
                    " benchmark_id, benchmark_hash, state, final, start_time, end_time,"
                    " image_mode) VALUES (?, ?, ?, ?, ?, ?, 'running', false, ?, NULL, ?)"
                    " ON CONFLICT (run_id) DO NOTHING",
                    [
                        run["run_id"], run["model_name"], run["model_version"],
                        run["endpoint_name"], run["benchmark_id"], run["benchmark_hash"],
                        run["start_time"], run.get("image_mode") or "image",
                    ],
                )  # fmt: skip
            for end in run_ends:
                self.con.execute(
                    "INSERT INTO runs (run_id, model_name, model_version, endpoint_name,"
                    " benchmark_id, benchmark_hash, state, final, start_time, end_time,"
                    " image_mode) VALUES (?, ?, ?, ?, ?, ?, ?, false, ?, ?, ?)"
                    " ON CONFLICT (run_id) DO UPDATE SET state = excluded.state,"
                    " end_time = excluded.end_time",
                    [
                        end["run_id"], end["model_name"], end["model_version"],
                        end["endpoint_name"], end["benchmark_id"], end["benchmark_hash"],
                        end["state"], end["start_time"], end["end_time"],
                        end.get("image_mode") or "image",
                    ],
                )  # fmt: skip
                self._pair_ended_run(str(end["run_id"]))
            self.con.execute(
                "INSERT INTO position VALUES (1, ?) ON CONFLICT (id) DO UPDATE"
                " SET last_seq = excluded.last_seq",
                [last_seq],
            )
            self.con.execute("COMMIT")
        except Exception:
            self.con.execute("ROLLBACK")
            raise

    def _pair_ended_run(self, run_id: str) -> None:
        """Record the base and pair runs of a run that just ended (inside the caller's
        transaction)."""
        run = self.con.execute(
            "SELECT model_name, benchmark_hash, image_mode, start_time, state FROM runs"
            " WHERE run_id = ?",
            [run_id],
        ).fetchone()
        if run is None or run[4] != "succeeded":
            return
        model, bench, mode, start, _ = run
        base = self.con.execute(
            _BASE_RUN, [model, bench, mode, run_id, start, start, run_id]
        ).fetchone()
        other = "image" if mode == "text_only" else "text_only"
        pair = self.con.execute(_PAIR_RUN, [model, bench, other]).fetchone()
        self.con.execute(
            "UPDATE runs SET base_run_id = ?, pair_run_id = ? WHERE run_id = ?",
            [base[0] if base else "", pair[0] if pair else "", run_id],
        )

    def unfinished_ends(self) -> list[str]:
        """Runs that ended but whose final figures are not stored yet, in end order."""
        rows = self.con.execute(
            "SELECT run_id FROM runs WHERE state <> 'running' AND NOT final"
            " ORDER BY end_time NULLS LAST, run_id"
        ).fetchall()
        return [str(r[0]) for r in rows]

    def run_rows(self, run_id: str) -> pd.DataFrame:
        return self.con.execute("SELECT * FROM graded WHERE run_id = ? ORDER BY seq", [run_id]).df()

    def replace_figures(
        self,
        run_id: str,
        metrics: pd.DataFrame,
        bins: pd.DataFrame,
        alerts: Sequence[dict[str, object]] = (),
        *,
        credibility: dict[str, object] | None = None,
        drops: pd.DataFrame | None = None,
        regressions: pd.DataFrame | None = None,
        mark_final: bool = False,
    ) -> None:
        """Replace a run's figures in one transaction (readers never see half of them).

        ``drops`` replaces the text-only drops of this run's pairings, ``regressions`` the
        comparisons of this run against its base; alerts are only ever added. ``mark_final``
        marks the run final: its figures are complete, with intervals.
        """
        self.con.execute("BEGIN TRANSACTION")
        try:
            self.con.execute("DELETE FROM metrics WHERE run_id = ?", [run_id])
            self.con.execute("DELETE FROM reliability WHERE run_id = ?", [run_id])
            self._insert_df("metrics", metrics, METRIC_COLUMNS)
            self._insert_df("reliability", bins, RELIABILITY_COLUMNS)
            if credibility is not None:
                self.con.execute("DELETE FROM credibility WHERE run_id = ?", [run_id])
                self._insert_df("credibility", pd.DataFrame([credibility]), CREDIBILITY_COLUMNS)
            if drops is not None:
                self.con.execute(
                    "DELETE FROM text_only_drops WHERE image_run_id = ? OR text_run_id = ?",
                    [run_id, run_id],
                )
                self._insert_df("text_only_drops", drops, DROP_COLUMNS)
            if regressions is not None:
                self.con.execute("DELETE FROM regressions WHERE run_id = ?", [run_id])
                self._insert_df("regressions", regressions, REGRESSION_COLUMNS)
            if mark_final:
                self.con.execute("UPDATE runs SET final = true WHERE run_id = ?", [run_id])
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
            where.append(f"m.run_id IN ({LATEST_RUNS})")
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
        """Each model's latest run (with images, unless it only has text-only runs)."""
        return self.con.execute(f"SELECT * FROM runs WHERE run_id IN ({LATEST_RUNS})").df()

    def list_credibility(
        self, model_name: str = "", run_id: str = "", latest_only: bool = False
    ) -> pd.DataFrame:
        where, params = ["true"], []
        if model_name:
            where.append("c.model_name = ?")
            params.append(model_name)
        if run_id:
            where.append("c.run_id = ?")
            params.append(run_id)
        if latest_only:
            where.append(f"c.run_id IN ({LATEST_RUNS})")
        return self.con.execute(
            "SELECT c.*, r.start_time AS run_start_time FROM credibility c JOIN runs r USING"
            f" (run_id) WHERE {' AND '.join(where)} ORDER BY r.start_time DESC, c.run_id DESC",
            params,
        ).df()

    def list_text_only_drops(self, model_name: str = "", latest_only: bool = False) -> pd.DataFrame:
        """Text-only drops, newest text-only run first; ``latest_only``: each model's newest
        pairing per benchmark."""
        clause = "WHERE d.model_name = ?" if model_name else ""
        df = self.con.execute(
            "SELECT d.*, t.start_time AS text_start_time, i.start_time AS image_start_time"
            " FROM text_only_drops d JOIN runs t ON t.run_id = d.text_run_id"
            f" JOIN runs i ON i.run_id = d.image_run_id {clause}"
            " ORDER BY greatest(t.start_time, i.start_time) DESC, d.text_run_id DESC,"
            " d.image_run_id DESC, d.task",
            [model_name] if model_name else [],
        ).df()
        if latest_only and len(df):
            newest = df.drop_duplicates(["model_name", "benchmark_hash"])[
                ["image_run_id", "text_run_id"]
            ]
            df = df.merge(newest, on=["image_run_id", "text_run_id"])
        return df

    def list_regressions(self, model_name: str = "", run_id: str = "") -> pd.DataFrame:
        where, params = ["true"], []
        if model_name:
            where.append("g.model_name = ?")
            params.append(model_name)
        if run_id:
            where.append("g.run_id = ?")
            params.append(run_id)
        return self.con.execute(
            "SELECT g.*, r.start_time AS run_start_time FROM regressions g JOIN runs r USING"
            f" (run_id) WHERE {' AND '.join(where)}"
            " ORDER BY r.start_time DESC, g.run_id DESC, g.task, g.metric",
            params,
        ).df()
