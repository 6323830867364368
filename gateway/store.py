"""The gateway's DuckDB file: endpoints, runs, and the append-only response log.

One process (the gateway) opens this file. Log entries (responses and run ends) share one
sequence; the single writer assigns it and commits in order, so a follower that has read up to
``seq`` never later finds a smaller one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow as pa

from gateway.domain import Endpoint, LogEntry, Outcome, ResponseEntry, Run, RunEndEntry, RunState

SCHEMA = """
CREATE TABLE IF NOT EXISTS endpoints (
    name VARCHAR PRIMARY KEY,
    address VARCHAR NOT NULL,
    protocol VARCHAR NOT NULL,
    schedule_interval_s DOUBLE NOT NULL,
    schedule_benchmark VARCHAR NOT NULL,
    max_concurrency INTEGER NOT NULL,
    request_timeout_s DOUBLE NOT NULL,
    create_time TIMESTAMPTZ NOT NULL
);
CREATE TABLE IF NOT EXISTS runs (
    run_id VARCHAR PRIMARY KEY,
    endpoint_name VARCHAR NOT NULL,
    benchmark_id VARCHAR NOT NULL,
    benchmark_hash VARCHAR NOT NULL,
    benchmark_path VARCHAR NOT NULL,
    state VARCHAR NOT NULL,
    item_count BIGINT NOT NULL,
    trigger VARCHAR NOT NULL,
    error_message VARCHAR NOT NULL,
    model_name VARCHAR NOT NULL,
    model_version VARCHAR NOT NULL,
    create_time TIMESTAMPTZ NOT NULL,
    start_time TIMESTAMPTZ,
    end_time TIMESTAMPTZ
);
CREATE TABLE IF NOT EXISTS responses (
    seq BIGINT PRIMARY KEY,
    run_id VARCHAR NOT NULL,
    benchmark_id VARCHAR NOT NULL,
    benchmark_hash VARCHAR NOT NULL,
    item_id VARCHAR NOT NULL,
    format VARCHAR NOT NULL,
    phrasing VARCHAR NOT NULL,
    option_order VARCHAR NOT NULL,
    image_mode VARCHAR NOT NULL,
    endpoint_name VARCHAR NOT NULL,
    protocol VARCHAR NOT NULL,
    model_name VARCHAR NOT NULL,
    model_version VARCHAR NOT NULL,
    request_id VARCHAR NOT NULL,
    start_time TIMESTAMPTZ NOT NULL,
    latency_s DOUBLE NOT NULL,
    attempt_count INTEGER NOT NULL,
    outcome VARCHAR NOT NULL,
    raw_text VARCHAR NOT NULL,
    error_message VARCHAR NOT NULL,
    vigil_version VARCHAR NOT NULL,
    UNIQUE (run_id, item_id)
);
CREATE TABLE IF NOT EXISTS attempts (
    run_id VARCHAR NOT NULL,
    item_id VARCHAR NOT NULL,
    attempt INTEGER NOT NULL,
    start_time TIMESTAMPTZ NOT NULL,
    latency_s DOUBLE NOT NULL,
    outcome VARCHAR NOT NULL,
    error_message VARCHAR NOT NULL
);
CREATE TABLE IF NOT EXISTS run_events (
    seq BIGINT PRIMARY KEY,
    run_id VARCHAR NOT NULL,
    run_json VARCHAR NOT NULL
);
"""

RESPONSE_COLUMNS = [
    "seq", "run_id", "benchmark_id", "benchmark_hash", "item_id", "format", "phrasing",
    "option_order", "image_mode", "endpoint_name", "protocol", "model_name", "model_version",
    "request_id", "start_time", "latency_s", "attempt_count", "outcome", "raw_text",
    "error_message", "vigil_version", "model_config_digest", "logprobs_json",
]  # fmt: skip


# Columns added after the first release; existing files gain them on open.
ENDPOINT_COLUMNS = (
    "name, address, protocol, schedule_interval_s, schedule_benchmark, max_concurrency,"
    " request_timeout_s, create_time, model_name, model_version"
)

MIGRATIONS = [
    ("endpoints", "model_name", "VARCHAR"),
    ("endpoints", "model_version", "VARCHAR"),
    ("runs", "image_mode", "VARCHAR"),
    ("responses", "model_config_digest", "VARCHAR"),
    ("responses", "logprobs_json", "VARCHAR"),
]

RESPONSE_TYPES = {
    name: pa.int64() if name == "seq" else pa.string() for name in RESPONSE_COLUMNS
} | {
    "start_time": pa.timestamp("us", tz="UTC"),
    "latency_s": pa.float64(),
    "attempt_count": pa.int32(),
}


def _ts(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def run_to_json(run: Run) -> str:
    return json.dumps(
        {
            "run_id": run.run_id,
            "endpoint_name": run.endpoint_name,
            "benchmark_id": run.benchmark_id,
            "benchmark_hash": run.benchmark_hash,
            "benchmark_path": run.benchmark_path,
            "state": run.state.value,
            "item_count": run.item_count,
            "completed_count": run.completed_count,
            "error_count": run.error_count,
            "trigger": run.trigger,
            "error_message": run.error_message,
            "model_name": run.model_name,
            "model_version": run.model_version,
            "create_time": _ts(run.create_time),
            "start_time": _ts(run.start_time),
            "end_time": _ts(run.end_time),
            "image_mode": run.image_mode,
        },
        sort_keys=True,
    )


def run_from_json(text: str) -> Run:
    d = json.loads(text)

    def t(key: str) -> datetime | None:
        return datetime.fromisoformat(d[key]) if d.get(key) else None

    create_time = t("create_time")
    assert create_time is not None
    return Run(
        run_id=d["run_id"],
        endpoint_name=d["endpoint_name"],
        benchmark_id=d["benchmark_id"],
        benchmark_hash=d["benchmark_hash"],
        benchmark_path=d["benchmark_path"],
        state=RunState(d["state"]),
        item_count=d["item_count"],
        trigger=d["trigger"],
        create_time=create_time,
        completed_count=d["completed_count"],
        error_count=d["error_count"],
        error_message=d["error_message"],
        model_name=d["model_name"],
        model_version=d["model_version"],
        start_time=t("start_time"),
        end_time=t("end_time"),
        image_mode=d.get("image_mode", "image"),
    )


def _utc(value: object) -> datetime | None:
    if value is None or value is pd.NaT:
        return None
    assert isinstance(value, datetime)
    return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)


class GatewayStore:
    """Synchronous access to ``gateway.duckdb``; used from the gateway's event-loop thread only."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.con = duckdb.connect(str(path))
        self.con.execute("SET TimeZone = 'UTC'")
        self.con.execute(SCHEMA)
        for table, column, kind in MIGRATIONS:
            self.con.execute(
                f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {kind} DEFAULT ''"
            )
        # The log's single writer commits on its own cursor, off the event loop (see Recorder).
        self.writer = self.con.cursor()
        self.writer.execute("SET TimeZone = 'UTC'")
        row = self.con.execute(
            "SELECT greatest((SELECT coalesce(max(seq), 0) FROM responses),"
            " (SELECT coalesce(max(seq), 0) FROM run_events))"
        ).fetchone()
        self.last_seq: int = int(row[0]) if row else 0

    def close(self) -> None:
        self.writer.close()
        self.con.close()

    # Endpoints -------------------------------------------------------------------------------

    def upsert_endpoint(self, ep: Endpoint) -> Endpoint:
        existing = self.get_endpoint(ep.name)
        create_time = existing.create_time if existing else datetime.now(UTC)
        self.con.execute("DELETE FROM endpoints WHERE name = ?", [ep.name])
        self.con.execute(
            f"INSERT INTO endpoints ({ENDPOINT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                ep.name, ep.address, ep.protocol, ep.schedule_interval_s, ep.schedule_benchmark,
                ep.max_concurrency, ep.request_timeout_s, create_time, ep.model_name,
                ep.model_version,
            ],
        )  # fmt: skip
        stored = self.get_endpoint(ep.name)
        assert stored is not None
        return stored

    def _endpoint(self, row: Sequence[object]) -> Endpoint:
        return Endpoint(
            name=str(row[0]),
            address=str(row[1]),
            protocol=str(row[2]),
            schedule_interval_s=float(row[3]),  # type: ignore[arg-type]
            schedule_benchmark=str(row[4]),
            max_concurrency=int(row[5]),  # type: ignore[call-overload]
            request_timeout_s=float(row[6]),  # type: ignore[arg-type]
            create_time=_utc(row[7]),
            model_name=str(row[8]),
            model_version=str(row[9]),
        )

    def get_endpoint(self, name: str) -> Endpoint | None:
        row = self.con.execute(
            f"SELECT {ENDPOINT_COLUMNS} FROM endpoints WHERE name = ?", [name]
        ).fetchone()
        return self._endpoint(row) if row else None

    def list_endpoints(self) -> list[Endpoint]:
        rows = self.con.execute(
            f"SELECT {ENDPOINT_COLUMNS} FROM endpoints ORDER BY name"
        ).fetchall()
        return [self._endpoint(r) for r in rows]

    # Runs ------------------------------------------------------------------------------------

    def insert_run(self, run: Run) -> None:
        self.con.execute(
            "INSERT INTO runs (run_id, endpoint_name, benchmark_id, benchmark_hash,"
            " benchmark_path, state, item_count, trigger, error_message, model_name,"
            " model_version, create_time, start_time, end_time, image_mode)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                run.run_id, run.endpoint_name, run.benchmark_id, run.benchmark_hash,
                run.benchmark_path, run.state.value, run.item_count, run.trigger,
                run.error_message, run.model_name, run.model_version, run.create_time,
                run.start_time, run.end_time, run.image_mode,
            ],
        )  # fmt: skip

    def update_run(self, run: Run, con: duckdb.DuckDBPyConnection | None = None) -> None:
        (con or self.con).execute(
            "UPDATE runs SET state = ?, error_message = ?, model_name = ?, model_version = ?,"
            " start_time = ?, end_time = ? WHERE run_id = ?",
            [
                run.state.value, run.error_message, run.model_name, run.model_version,
                run.start_time, run.end_time, run.run_id,
            ],
        )  # fmt: skip

    def _runs(self, where: str, params: list[object], limit: int) -> list[Run]:
        rows = self.con.execute(
            "SELECT r.run_id, r.endpoint_name, r.benchmark_id, r.benchmark_hash, r.benchmark_path,"
            " r.state, r.item_count, r.trigger, r.error_message, r.model_name, r.model_version,"
            " r.create_time, r.start_time, r.end_time,"
            " (SELECT count(*) FROM responses s WHERE s.run_id = r.run_id),"
            " (SELECT count(*) FROM responses s WHERE s.run_id = r.run_id AND s.outcome != 'ok'),"
            " r.image_mode"
            f" FROM runs r {where} ORDER BY r.create_time DESC, r.run_id DESC LIMIT {int(limit)}",
            params,
        ).fetchall()
        runs = []
        for r in rows:
            create_time = _utc(r[11])
            assert create_time is not None
            runs.append(
                Run(
                    run_id=r[0],
                    endpoint_name=r[1],
                    benchmark_id=r[2],
                    benchmark_hash=r[3],
                    benchmark_path=r[4],
                    state=RunState(r[5]),
                    item_count=int(r[6]),
                    trigger=r[7],
                    error_message=r[8],
                    model_name=r[9],
                    model_version=r[10],
                    create_time=create_time,
                    start_time=_utc(r[12]),
                    end_time=_utc(r[13]),
                    completed_count=int(r[14]),
                    error_count=int(r[15]),
                    image_mode=str(r[16] or "image"),
                )
            )
        return runs

    def get_run(self, run_id: str) -> Run | None:
        runs = self._runs("WHERE r.run_id = ?", [run_id], 1)
        return runs[0] if runs else None

    def list_runs(self, endpoint_name: str = "", limit: int = 100) -> list[Run]:
        if endpoint_name:
            return self._runs("WHERE r.endpoint_name = ?", [endpoint_name], limit)
        return self._runs("", [], limit)

    def unfinished_runs(self) -> list[Run]:
        return self._runs("WHERE r.state IN ('pending', 'running')", [], 1_000_000)

    def latest_run(self, endpoint_name: str) -> Run | None:
        runs = self.list_runs(endpoint_name, 1)
        return runs[0] if runs else None

    def attempts(self, run_id: str) -> list[tuple[object, ...]]:
        return self.con.execute(
            "SELECT item_id, attempt, outcome, error_message FROM attempts WHERE run_id = ?"
            " ORDER BY item_id, attempt",
            [run_id],
        ).fetchall()

    def recorded_item_ids(self, run_id: str) -> set[str]:
        rows = self.con.execute("SELECT item_id FROM responses WHERE run_id = ?", [run_id])
        return {r[0] for r in rows.fetchall()}

    # The log ---------------------------------------------------------------------------------

    def append(self, entries: Sequence[LogEntry], run_updates: Sequence[Run] = ()) -> list[int]:
        """Append entries in one transaction, assigning consecutive sequence numbers.

        Runs on the writer cursor; the Recorder calls it from a worker thread, one call at a time.
        """
        seqs: list[int] = []
        columns: dict[str, list[object]] = {name: [] for name in RESPONSE_COLUMNS}
        events: list[tuple[int, str, str]] = []
        retried: list[tuple[object, ...]] = []
        seq = self.last_seq
        for entry in entries:
            seq += 1
            seqs.append(seq)
            if isinstance(entry, ResponseEntry):
                for name in RESPONSE_COLUMNS:
                    columns[name].append(seq if name == "seq" else getattr(entry, name))
                retried.extend((entry.run_id, entry.item_id, *a) for a in entry.failed_attempts)
            else:
                events.append((seq, entry.run.run_id, run_to_json(entry.run)))
        con = self.writer
        con.execute("BEGIN TRANSACTION")
        try:
            if columns["seq"]:
                columns["outcome"] = [o.value for o in columns["outcome"]]  # type: ignore[attr-defined]
                batch = pa.table(
                    {
                        name: pa.array(values, type=RESPONSE_TYPES[name])
                        for name, values in columns.items()
                    }
                )
                con.register("vigil_batch", batch)
                try:
                    con.execute(
                        f"INSERT INTO responses SELECT {', '.join(RESPONSE_COLUMNS)} FROM vigil_batch"
                    )
                finally:
                    con.unregister("vigil_batch")
            if events:
                con.executemany("INSERT INTO run_events VALUES (?, ?, ?)", events)
            if retried:
                con.executemany("INSERT INTO attempts VALUES (?, ?, ?, ?, ?, ?, ?)", retried)
            for run in run_updates:
                self.update_run(run, con)
            con.execute("COMMIT")
        except Exception:
            con.execute("ROLLBACK")
            raise
        self.last_seq = seq
        return seqs

    def read_log(self, after_seq: int, limit: int = 1000) -> list[LogEntry]:
        """Log entries with ``seq > after_seq``, in order."""
        cols = ", ".join(RESPONSE_COLUMNS)
        rows = self.con.execute(
            f"SELECT {cols} FROM responses WHERE seq > ? ORDER BY seq LIMIT ?", [after_seq, limit]
        ).fetchall()
        events = self.con.execute(
            "SELECT seq, run_json FROM run_events WHERE seq > ? ORDER BY seq LIMIT ?",
            [after_seq, limit],
        ).fetchall()
        entries: list[LogEntry] = []
        for r in rows:
            d = dict(zip(RESPONSE_COLUMNS, r, strict=True))
            start = _utc(d.pop("start_time"))
            assert start is not None
            d["outcome"] = Outcome(d["outcome"])
            entries.append(ResponseEntry(start_time=start, **d))  # type: ignore[arg-type]
        entries.extend(RunEndEntry(run=run_from_json(j), seq=int(s)) for s, j in events)
        entries.sort(key=lambda e: e.seq)
        if len(entries) > limit:
            entries = entries[:limit]
        return entries
