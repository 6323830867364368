"""MedRCube's credibility groups, the shortcut correlation and the text-only drop, by hand."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from scipy import stats

from grader.credibility import credibility, shortcut_correlation, text_only_drop


def item(subject: str, image: str, level: str, right: bool, outcome: str = "answered",
         task: str = "t", item_id: str = "") -> dict[str, object]:  # fmt: skip
    return {
        "subject_id": subject, "image_path": image, "hierarchy": level, "outcome": outcome,
        "correct": right and outcome == "answered", "confidence": 80, "task": task,
        "format": "mc", "true_class": "x", "pred_class": "x" if right else "y",
        "item_id": item_id or f"{image}-{level}-{right}-{outcome}",
    }  # fmt: skip


def test_groups_a_to_d_by_hand() -> None:
    rows = pd.DataFrame(
        [
            # Image 1: 2 low (1 right), 1 high (right): pairs A=1, D=1.
            item("s1", "i1", "low", True, item_id="a"), item("s1", "i1", "low", False, item_id="b"),
            item("s1", "i1", "high", True, item_id="c"),
            # Image 2: 1 low (right), 2 high (1 wrong, 1 abstained): B=2.
            item("s2", "i2", "low", True, item_id="d"), item("s2", "i2", "high", False, item_id="e"),
            item("s2", "i2", "high", False, "abstained", item_id="f"),
            # Image 3: 1 low wrong, 1 high wrong: C=1; a transport error is left out.
            item("s3", "i3", "low", False, item_id="g"), item("s3", "i3", "high", False, item_id="h"),
            item("s3", "i3", "high", True, "transport_error", item_id="i"),
            # Image 4: only a low-level item: no pairs. A mid-level item never pairs.
            item("s4", "i4", "low", True, item_id="j"), item("s4", "i4", "mid", True, item_id="k"),
        ]
    )  # fmt: skip
    c = credibility(rows, n_resamples=0, seed=0, min_subjects=5)
    assert (c.a_count, c.b_count, c.c_count, c.d_count) == (1, 2, 1, 1)
    assert (c.image_count, c.pair_count, c.subject_count) == (3, 5, 3)
    assert c.luck_rate == 1 / 2  # D / (A + D)
    assert c.shortcut_probability == 1 / 2  # D / (C + D)
    assert c.rationality == 1 / 2
    assert c.too_few_subjects and not c.has_interval
    # High level: answered c (right), e (wrong), h (wrong) -> 1/3; low: a, d, j right of a,b,d,g,j.
    assert c.high_level_accuracy == pytest.approx(1 / 3)
    assert c.low_level_accuracy == pytest.approx(3 / 5)


def test_intervals_with_enough_subjects_and_undefined_ratios() -> None:
    rows = pd.DataFrame(
        [item(f"s{k}", f"i{k}", "low", k % 2 == 0) for k in range(12)]
        + [item(f"s{k}", f"i{k}", "high", k % 3 == 0) for k in range(12)]
    )
    c = credibility(rows, n_resamples=200, seed=[0, 1], min_subjects=5)
    assert c.has_interval and not c.too_few_subjects
    lo, hi = c.shortcut_interval
    assert lo <= c.shortcut_probability <= hi
    assert c.rationality_interval == pytest.approx((1 - c.luck_interval[1], 1 - c.luck_interval[0]))
    again = credibility(rows, n_resamples=200, seed=[0, 1], min_subjects=5)
    assert again == c
    nothing = credibility(rows[rows.hierarchy == "low"], n_resamples=200, seed=0, min_subjects=5)
    assert nothing.pair_count == 0 and math.isnan(nothing.luck_rate) and not nothing.has_interval


def test_shortcut_correlation_matches_scipy_and_needs_three_models() -> None:
    x, y = [0.2, 0.5, 0.4, 0.9], [0.3, 0.6, 0.35, 0.8]
    corr = shortcut_correlation(x, y)
    expected = stats.pearsonr(x, y)
    assert corr.has_correlation and corr.model_count == 4
    assert corr.r == pytest.approx(expected.statistic) and corr.p_value == pytest.approx(
        expected.pvalue
    )
    few = shortcut_correlation([0.2, 0.5, math.nan], [0.3, 0.6, 0.1])
    assert not few.has_correlation and few.model_count == 2 and "3 models" in few.note
    flat = shortcut_correlation([0.5, 0.5, 0.5], [0.1, 0.2, 0.3])
    assert not flat.has_correlation and math.isnan(flat.r)


def test_text_only_drop_paired_by_subject() -> None:
    subjects = [f"s{k}" for k in range(10)]
    image = pd.DataFrame(
        [item(s, s, "high", True, task=t, item_id=f"{s}{t}") for s in subjects for t in ("p", "q")]
    )
    text = pd.DataFrame(
        [item(s, s, "high", k < 5 or t == "q", task=t, item_id=f"{s}{t}")
         for k, s in enumerate(subjects) for t in ("p", "q")]
    )  # fmt: skip
    drops = {
        d.task: d for d in text_only_drop(image, text, n_resamples=300, seed=0, min_subjects=5)
    }
    assert list(drops) == ["all", "p", "q"]
    assert drops["all"].image_accuracy == 1.0 and drops["all"].text_accuracy == 0.75
    assert drops["all"].drop == 0.25 and drops["p"].drop == 0.5 and drops["q"].drop == 0.0
    assert drops["p"].has_interval and 0 < drops["p"].lower <= 0.5 <= drops["p"].upper
    assert drops["all"].subject_count == 10 and not drops["all"].too_few_subjects
