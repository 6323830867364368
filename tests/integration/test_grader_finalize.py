"""Final figures of ended runs: pairings fixed at the run's end, computed off the event loop,
and picked up again after a restart that interrupted them."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd

from grader.exporter import GraderExporter
from grader.pipeline import Grader
from grader.settings import GraderSettings
from grader.store import GRADED_COLUMNS, GraderStore

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def run_rows(run_id: str, first_seq: int, mode: str, skill: float) -> pd.DataFrame:
    rng = np.random.default_rng(first_seq)
    rows = []
    for k in range(60):
        subject, level = f"s{k // 6:02d}", ("low" if k % 2 else "high")
        right = bool(rng.random() < skill)
        row: dict[str, object] = {c: "" for c in GRADED_COLUMNS}
        row.update(
            seq=first_seq + k, run_id=run_id, model_name="m", model_version="1",
            endpoint_name="e", benchmark_id="b", benchmark_hash="h", item_id=f"i{k}",
            subject_id=subject, task="plane" if k % 2 else "tumor", format="mc",
            image_mode=mode, is_control=False, outcome="answered", confidence=80,
            correct=right, true_class="x", pred_class="x" if right else "y",
            start_time=T0, latency_s=0.1, hierarchy=level, image_path=f"img{k // 2}",
            expect_abstain=False, hallucinated=-1,
        )  # fmt: skip
        rows.append(row)
    return pd.DataFrame(rows)


def fill(store: GraderStore) -> None:
    seq = 0
    for i, (run_id, mode, skill) in enumerate(
        [("r1", "image", 0.9), ("r2", "image", 0.3), ("r3", "text_only", 0.5)]
    ):
        start = T0 + timedelta(hours=i)
        run = {"run_id": run_id, "model_name": "m", "model_version": "1", "endpoint_name": "e",
               "benchmark_id": "b", "benchmark_hash": "h", "start_time": start,
               "image_mode": mode}  # fmt: skip
        end = run | {"state": "succeeded", "end_time": start + timedelta(minutes=5)}
        store.apply_batch(run_rows(run_id, seq + 1, mode, skill), [run], [end], seq + 61)
        seq += 61


def tables(store: GraderStore) -> dict[str, pd.DataFrame]:
    return {
        name: store.con.execute(f"SELECT * FROM {name} ORDER BY ALL").df()
        for name in ("metrics", "credibility", "regressions", "text_only_drops", "alerts")
    }


def test_ended_runs_are_finalised_with_fixed_pairings(tmp_path: Path) -> None:
    settings = GraderSettings(bootstrap_resamples=100, db_path=tmp_path / "a.duckdb")
    store = GraderStore(settings.db_path)
    fill(store)
    runs = store.list_runs().set_index("run_id")
    assert not runs["final"].any()  # ended, figures not computed yet
    assert runs.loc["r2", "base_run_id"] == "r1" and runs.loc["r1", "base_run_id"] == ""
    assert runs.loc["r3", "pair_run_id"] == "r2" and runs.loc["r2", "pair_run_id"] == ""
    # A grader started on this file picks the unfinished runs up, in the order they ended.
    grader = Grader(store, settings, GraderExporter())
    assert grader.pending == ["r1", "r2", "r3"]
    asyncio.run(grader.finalize_pending())
    assert store.list_runs()["final"].all() and not grader.pending

    regressions = store.list_regressions(run_id="r2")
    assert set(regressions["base_run_id"]) == {"r1"}
    acc = regressions[(regressions.task == "all") & (regressions.metric == "accuracy")].iloc[0]
    assert acc["difference"] < 0 and acc["regressed"]
    assert "r2:regression:all:accuracy" in set(store.list_alerts()["alert_id"])
    drops = store.list_text_only_drops()
    assert set(zip(drops.image_run_id, drops.text_run_id, strict=True)) == {("r2", "r3")}
    assert len(store.list_credibility()) == 3

    # The same log in a fresh file gives the same numbers.
    again = GraderStore(tmp_path / "b.duckdb")
    fill(again)
    asyncio.run(Grader(again, settings, GraderExporter()).finalize_pending())
    for name, frame in tables(store).items():
        pd.testing.assert_frame_equal(frame, tables(again)[name], obj=name)
    store.close()
    again.close()
