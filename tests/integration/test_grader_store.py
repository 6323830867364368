"""The grader's DuckDB file: an existing file from before the new columns opens and works."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pandas as pd

from grader.store import GRADED_COLUMNS, GraderStore

# The graded table and runs table as the first release created them.
OLD_SCHEMA = """
CREATE TABLE graded (
    seq BIGINT PRIMARY KEY, run_id VARCHAR NOT NULL, model_name VARCHAR NOT NULL,
    model_version VARCHAR NOT NULL, endpoint_name VARCHAR NOT NULL,
    benchmark_id VARCHAR NOT NULL, benchmark_hash VARCHAR NOT NULL, item_id VARCHAR NOT NULL,
    subject_id VARCHAR NOT NULL, task VARCHAR NOT NULL, format VARCHAR NOT NULL,
    phrasing VARCHAR NOT NULL, image_mode VARCHAR NOT NULL, is_control BOOLEAN NOT NULL,
    plane VARCHAR NOT NULL, sequence VARCHAR NOT NULL, modality VARCHAR NOT NULL,
    anatomy VARCHAR NOT NULL, dataset VARCHAR NOT NULL, gateway_outcome VARCHAR NOT NULL,
    outcome VARCHAR NOT NULL, reason VARCHAR NOT NULL, letter VARCHAR NOT NULL,
    confidence INTEGER NOT NULL, correct BOOLEAN NOT NULL, true_class VARCHAR NOT NULL,
    pred_class VARCHAR NOT NULL, start_time TIMESTAMPTZ NOT NULL, latency_s DOUBLE NOT NULL
);
CREATE TABLE runs (
    run_id VARCHAR PRIMARY KEY, model_name VARCHAR NOT NULL, model_version VARCHAR NOT NULL,
    endpoint_name VARCHAR NOT NULL, benchmark_id VARCHAR NOT NULL,
    benchmark_hash VARCHAR NOT NULL, state VARCHAR NOT NULL, final BOOLEAN NOT NULL,
    start_time TIMESTAMPTZ NOT NULL, end_time TIMESTAMPTZ
);
"""
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def row(seq: int, run_id: str, **extra: object) -> dict[str, object]:
    base: dict[str, object] = {c: "" for c in GRADED_COLUMNS}
    base.update(
        seq=seq, run_id=run_id, model_name="m", model_version="1", is_control=False,
        confidence=80, correct=True, start_time=T0, latency_s=0.1, outcome="answered",
        image_mode="image", expect_abstain=False, hallucinated=-1,
    )  # fmt: skip
    base.update(extra)
    return base


def test_an_old_file_gains_the_new_columns(tmp_path: Path) -> None:
    path = tmp_path / "grader.duckdb"
    con = duckdb.connect(str(path))
    con.execute(OLD_SCHEMA)
    old = row(1, "r0")
    con.execute(
        f"INSERT INTO graded VALUES ({', '.join('?' for _ in range(29))})",
        [old[c] for c in GRADED_COLUMNS[:29]],
    )
    con.execute("INSERT INTO runs VALUES ('r0', 'm', '1', 'e', 'b', 'h', 'succeeded', true, ?, ?)",
                [T0, T0])  # fmt: skip
    con.close()

    store = GraderStore(path)
    try:
        first = store.run_rows("r0").iloc[0]
        assert (first["hierarchy"], first["image_path"], first["hallucinated"]) == ("", "", -1)
        assert store.get_run("r0")["image_mode"] == "image"  # type: ignore[index]
        new = pd.DataFrame([row(2, "r1", hierarchy="high", image_path="images/a.png",
                                hallucinated=1, image_mode="text_only")])  # fmt: skip
        run = {"run_id": "r1", "model_name": "m", "model_version": "1", "endpoint_name": "e",
               "benchmark_id": "b", "benchmark_hash": "h", "start_time": T0,
               "image_mode": "text_only"}  # fmt: skip
        store.apply_batch(new, [run], [], 2)
        got = store.run_rows("r1").iloc[0]
        assert (got["hierarchy"], got["image_path"], got["hallucinated"]) == (
            "high", "images/a.png", 1,
        )  # fmt: skip
        assert store.get_run("r1")["image_mode"] == "text_only"  # type: ignore[index]
        # The model's latest run for the fleet is its newest run with images.
        assert list(store.latest_runs()["run_id"]) == ["r0"]
    finally:
        store.close()
    # Opening again is a no-op.
    GraderStore(path).close()
