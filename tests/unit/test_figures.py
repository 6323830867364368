"""The one-pass group tables equal a count table built on each group's own rows."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from grader.figures import VOXEL, compute_run_figures, group_tables, groups, metric_rows
from grader.metrics import build_count_table, compute_metrics


def graded(n: int = 600, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    task = rng.choice(["plane", "tumor"], n)
    true = np.where(task == "plane", rng.choice(["ax", "co", "sa"], n), rng.choice(["y", "n"], n))
    right = rng.random(n) < 0.6
    outcome = rng.choice(["answered", "abstained", "unparseable", "transport_error"], n,
                         p=[0.85, 0.05, 0.05, 0.05])  # fmt: skip
    pred = np.where(right, true, np.where(task == "plane", "co", "n"))
    return pd.DataFrame(
        {
            "subject_id": [f"s{k:02d}" for k in rng.integers(0, 12, n)],
            "task": task, "format": rng.choice(["mc", "open"], n),
            "phrasing": rng.choice(["neutral", "terse"], n), "outcome": outcome,
            "correct": (outcome == "answered") & (pred == true),
            "confidence": np.where(rng.random(n) < 0.1, -1, rng.integers(0, 101, n)),
            "true_class": true, "pred_class": np.where(outcome == "answered", pred, ""),
            "plane": rng.choice(["axial", ""], n), "sequence": "", "dataset": "d",
            "modality": rng.choice(["MR", "CT"], n), "anatomy": "brain",
            "laterality": rng.choice(["left", "right", ""], n),
            "hierarchy": np.where(task == "plane", "low", "high"),
        }
    )  # fmt: skip


def test_group_tables_equal_tables_built_per_group() -> None:
    rows = graded()
    built = group_tables(rows)
    keys = {(g.task, g.fmt, g.axis, g.value) for g in built.groups}
    assert ("all", "all", "", "") in keys and ("plane", "open", "", "") in keys
    assert {("all", "all", "phrasing", "terse"), ("all", "all", "laterality", "left"),
            ("all", "all", "hierarchy", "high"), ("plane", "all", VOXEL, "CT/brain")} <= keys  # fmt: skip
    assert not any(g.axis == "sequence" for g in built.groups)  # "" is no group
    for g, table in zip(built.groups, built.tables, strict=True):
        own = build_count_table(metric_rows(rows.iloc[g.rows]))
        assert table.shape[0] == own.n_subjects == built.subject_counts[list(built.groups).index(g)]
        mine = compute_metrics(table.sum(axis=0), built.layout)
        theirs = compute_metrics(own.totals(), own.layout)
        for name, value in theirs.items():
            assert mine[name] == pytest.approx(value, rel=1e-12, nan_ok=True), (g, name)
        # The per-subject confidence counts are the same, subject by subject.
        np.testing.assert_array_equal(
            table[:, own.layout.correct_at], own.counts[:, own.layout.correct_at]
        )


def test_a_task_in_one_modality_has_no_voxels() -> None:
    rows = graded()
    rows["modality"] = "MR"
    assert not [g for g in groups(rows) if g.axis == VOXEL]


def test_figures_rows_and_intervals() -> None:
    rows = graded()
    metrics, bins = compute_run_figures(rows, "r", "m", final=True, n_resamples=100, seed=0,
                                        min_subjects=5)  # fmt: skip
    pooled = metrics[
        (metrics.task == "all") & (metrics.format == "all") & (metrics.group_axis == "")
    ]
    assert pooled.has_interval.any() and (pooled.response_count == len(rows)).all()
    assert set(bins.task) == {"all", "plane", "tumor"}
    again, _ = compute_run_figures(rows, "r", "m", final=True, n_resamples=100, seed=0,
                                   min_subjects=5)  # fmt: skip
    pd.testing.assert_frame_equal(metrics, again)
