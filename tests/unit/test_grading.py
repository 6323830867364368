"""Grading against the answer key, and a run's figures and alerts (pure functions)."""

from __future__ import annotations

import math

import pandas as pd

from grader.figures import compute_run_figures, run_alerts
from grader.grading import KeyItem, grade

KEY = KeyItem(
    subject_id="sub-1",
    task="plane",
    format="mc",
    phrasing="neutral",
    options=("sagittal", "axial", "coronal"),
    answer="axial",
    answer_letter="B",
    is_control=False,
    axes={"plane": "axial", "sequence": "T1", "modality": "MR", "anatomy": "brain", "dataset": "x"},
)


def test_grade_right_wrong_abstained_unparseable_and_transport() -> None:
    right = grade("ok", "Answer: B\nConfidence: 100", KEY)
    assert (right.outcome, right.correct, right.confidence, right.pred_class) == (
        "answered", True, 100, "axial",
    )  # fmt: skip
    wrong = grade("ok", "Answer: C\nConfidence: 85", KEY)
    assert (wrong.outcome, wrong.correct, wrong.pred_class) == ("answered", False, "coronal")
    noconf = grade("ok", "Answer: B", KEY)
    assert noconf.outcome == "answered" and noconf.confidence == -1
    assert grade("ok", "Answer: UNSURE\nConfidence: 10", KEY).outcome == "abstained"
    garbage = grade("ok", "lorem ipsum dolor", KEY)
    assert garbage.outcome == "unparseable" and not garbage.correct
    for gateway_outcome in ("timeout", "transport_error"):
        g = grade(gateway_outcome, "", KEY)
        assert g.outcome == "transport_error" and not g.correct


def rows(spec: list[tuple[str, str, bool, int]]) -> pd.DataFrame:
    """(subject, outcome, correct, confidence) -> graded rows of one task."""
    return pd.DataFrame(
        [
            {"subject_id": s, "task": "plane", "format": "mc", "outcome": o, "correct": c,
             "confidence": conf, "true_class": "axial",
             "pred_class": ("axial" if c else "coronal") if o == "answered" else "",
             "plane": "axial", "sequence": "", "modality": "MR", "anatomy": "brain", "dataset": "x"}
            for s, o, c, conf in spec
        ]
    )  # fmt: skip


def test_run_figures_by_hand() -> None:
    # 6 subjects; answered: 4 (3 right at 100, 1 wrong at 90), 1 abstained, 1 transport error.
    df = rows(
        [("a", "answered", True, 100), ("b", "answered", True, 100), ("c", "answered", True, 100),
         ("d", "answered", False, 90), ("e", "abstained", False, -1),
         ("f", "transport_error", False, -1)]
    )  # fmt: skip
    metrics, bins = compute_run_figures(
        df, "run-1", "m", final=True, n_resamples=100, seed=0, min_subjects=5
    )
    top = metrics[(metrics.task == "all") & (metrics.format == "all") & (metrics.group_axis == "")]
    value = dict(zip(top.metric, top.value, strict=True))
    assert value["coverage"] == 4 / 5  # the transport error leaves the denominator
    assert value["accuracy"] == 3 / 4
    assert value["cw_rate"] == 1 / 4
    assert value["conf_wrong"] == 0.9
    # Brier: three (1-1)^2 and one (0.9-0)^2 over four.
    assert math.isclose(value["brier"], 0.81 / 4)
    # ECE: one bin (90-100) holding all four: |0.75 - 0.975|.
    assert math.isclose(value["ece"], 0.225)
    assert value["transport_error_rate"] == 1 / 6
    defined = top[top.value.notna()]  # hallucination and abstention need columns these lack
    assert set(top.metric) - set(defined.metric) == {"hallucination_rate", "abstention_appropriate"}
    assert bool(defined.has_interval.all()) and not bool(top.too_few_subjects.any())
    assert set(metrics.group_axis) == {"", "plane", "modality", "anatomy", "dataset"}
    top_bin = bins[(bins.task == "all") & (bins.format == "all")].set_index("bin").loc[9]
    assert (top_bin["count"], top_bin["lower_percent"], top_bin["upper_percent"]) == (4, 90, 100)


def test_too_few_subjects_get_no_interval_and_in_flight_figures_have_none() -> None:
    df = rows([("a", "answered", True, 70), ("b", "answered", False, 70)])
    metrics, _ = compute_run_figures(
        df, "r", "m", final=True, n_resamples=100, seed=0, min_subjects=5
    )
    assert metrics.too_few_subjects.all() and not metrics.has_interval.any()
    df = rows([(s, "answered", True, 70) for s in "abcdefg"])
    metrics, _ = compute_run_figures(
        df, "r", "m", final=False, n_resamples=100, seed=0, min_subjects=5
    )
    assert not metrics.has_interval.any() and not metrics.final.any()


def test_figures_are_deterministic_for_a_run() -> None:
    df = rows([(s, "answered", i % 3 == 0, 10 * i) for i, s in enumerate("abcdefghij")])
    one, _ = compute_run_figures(df, "r", "m", final=True, n_resamples=200, seed=0, min_subjects=5)
    two, _ = compute_run_figures(df, "r", "m", final=True, n_resamples=200, seed=0, min_subjects=5)
    pd.testing.assert_frame_equal(one, two)


def test_alerts_for_failed_runs_and_transport_errors() -> None:
    df = rows([("a", "answered", True, 70)] * 9 + [("b", "transport_error", False, -1)])
    run = {
        "run_id": "r",
        "model_name": "m",
        "state": "failed",
        "end_time": None,
        "start_time": None,
    }
    kinds = {a["kind"] for a in run_alerts(df, run, 0.05)}
    assert kinds == {"run_failed", "transport_errors"}
    run["state"] = "succeeded"
    assert run_alerts(df, run, 0.2) == []
