"""Grading open-ended and abstention items, hallucination, and answer keys of both formats."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from grader.figures import compute_run_figures
from grader.grading import (
    KEY_COLUMNS,
    KEY_COLUMNS_ALL,
    KEY_COLUMNS_V1,
    Graded,
    KeyItem,
    grade,
    key_columns,
    key_from_row,
)

AXES = {"plane": "axial", "sequence": "T1", "modality": "MR", "anatomy": "brain", "dataset": "x"}
OPEN_TUMOR = KeyItem(
    subject_id="sub-1", task="tumor_visible", format="open", phrasing="neutral",
    options=("yes", "no"), answer="no", answer_letter="", is_control=False, axes=AXES,
    supported_findings=(),
)  # fmt: skip
OPEN_LATERALITY = dataclasses.replace(
    OPEN_TUMOR,
    task="laterality",
    options=("left", "right", "bilateral", "none"),
    answer="left",
    supported_findings=("tumor", "edema", "laterality_left"),
)
ABSTAIN_MC = KeyItem(
    subject_id="ctrl-1", task="abstention", format="mc", phrasing="neutral",
    options=("T1", "T2", "UNSURE"), answer="UNSURE", answer_letter="C", is_control=True,
    axes=AXES, expect_abstain=True,
)  # fmt: skip


def test_open_answers_are_normalised_and_graded() -> None:
    right = grade("ok", "No tumour is visible.\nConfidence: 90", OPEN_TUMOR)
    assert (right.outcome, right.correct, right.pred_class, right.confidence) == (
        "answered", True, "no", 90,
    )  # fmt: skip
    assert (right.letter, right.hallucinated, right.findings) == ("", 0, ())
    left = grade("ok", "A tumor in the left hemisphere with edema.", OPEN_LATERALITY)
    assert (left.correct, left.pred_class, left.hallucinated) == (True, "left", 0)
    assert left.findings == ("tumor", "edema", "laterality_left")


def test_unsupported_findings_are_hallucinations_and_refusals_are_not() -> None:
    wrong = grade("ok", "Yes, there is a large mass with necrosis.", OPEN_TUMOR)
    assert (wrong.correct, wrong.hallucinated) == (False, 1)
    assert wrong.findings == ("tumor", "necrosis")
    bare_yes = grade("ok", "Yes.", OPEN_TUMOR)  # answering "yes" asserts a tumour
    assert (bare_yes.findings, bare_yes.hallucinated) == (("tumor",), 1)
    refusal = grade("ok", "I cannot assess this image.", OPEN_TUMOR)
    assert (refusal.outcome, refusal.hallucinated, refusal.findings) == ("abstained", 0, ())
    hedge = grade("ok", "A tumor cannot be excluded.", OPEN_TUMOR)
    assert (hedge.outcome, hedge.hallucinated) == ("abstained", 0)
    right_side = grade("ok", "Right.", OPEN_LATERALITY)
    assert (right_side.correct, right_side.hallucinated) == (False, 1)  # laterality_right
    unknown = dataclasses.replace(OPEN_TUMOR, supported_findings=None)
    assert grade("ok", "A tumor.", unknown).hallucinated == -1  # the key does not say


def test_multiple_choice_and_transport_errors_are_not_graded_for_hallucination() -> None:
    mc = dataclasses.replace(OPEN_TUMOR, format="mc", options=("yes", "no"), answer_letter="B")
    graded = grade("ok", "Answer: A (a tumor)\nConfidence: 80", mc)
    assert (graded.correct, graded.hallucinated, graded.findings) == (False, -1, ())
    for key in (OPEN_TUMOR, mc):
        lost = grade("timeout", "", key)
        assert (lost.outcome, lost.hallucinated, lost.correct) == ("transport_error", -1, False)


def test_expect_abstain_items_are_right_exactly_when_the_model_abstains() -> None:
    abstained = grade("ok", "UNSURE\nConfidence: 20", ABSTAIN_MC)
    assert (abstained.outcome, abstained.correct) == ("abstained", True)
    chose_unsure = grade("ok", "Answer: C", ABSTAIN_MC)  # the UNSURE option is an abstention
    assert (chose_unsure.outcome, chose_unsure.correct, chose_unsure.reason) == (
        "abstained", True, "unsure_option",
    )  # fmt: skip
    answered = grade("ok", "Answer: A\nConfidence: 95", ABSTAIN_MC)
    assert (answered.outcome, answered.correct, answered.pred_class) == ("answered", False, "T1")
    garbage = grade("ok", "lorem ipsum", ABSTAIN_MC)
    assert (garbage.outcome, garbage.correct) == ("unparseable", False)
    open_item = dataclasses.replace(ABSTAIN_MC, format="open", answer_letter="")
    assert grade("ok", "I cannot determine this.", open_item).correct
    assert not grade("ok", "It is T2.", open_item).correct


def test_graded_keeps_positional_construction() -> None:
    g = Graded("answered", "A", 50, True, "x", "answer_label")
    assert (g.hallucinated, g.findings) == (-1, ())


V1_ROW = {
    "item_id": "i1", "subject_id": "sub-1", "task": "plane", "format": "mc",
    "phrasing": "neutral", "options": np.array(["axial", "coronal"]), "answer": "axial",
    "answer_letter": "A", "is_control": False, "modality": "MR", "anatomy": "brain",
    "dataset": "d", "plane": "axial", "sequence": None,
}  # fmt: skip


def test_key_from_a_v1_row_takes_defaults() -> None:
    key = key_from_row(V1_ROW)
    assert key.options == ("axial", "coronal")
    assert key.axes["sequence"] == ""
    assert (key.hierarchy, key.laterality, key.split) == ("", "", "")
    assert key.supported_findings is None
    assert not key.expect_abstain and not key.image_missing
    sparse = key_from_row({"item_id": "i2", "subject_id": "s", "task": "plane"})
    assert (sparse.format, sparse.options, sparse.answer) == ("mc", (), "")


def test_key_from_a_v2_row_reads_the_new_columns() -> None:
    row = dict(V1_ROW, format="open", answer_letter="", hierarchy="low", laterality="left",
               supported_findings=np.array(["tumor", "laterality_left"]), split="test",
               image_missing=False, expect_abstain=True)  # fmt: skip
    key = key_from_row(row)
    assert key.supported_findings == ("tumor", "laterality_left")
    assert (key.hierarchy, key.laterality, key.split, key.expect_abstain) == (
        "low", "left", "test", True,
    )  # fmt: skip
    empty = key_from_row(dict(row, supported_findings=[]))
    assert empty.supported_findings == ()


def test_key_columns_ask_only_for_what_a_manifest_has() -> None:
    assert key_columns(KEY_COLUMNS_V1) == KEY_COLUMNS_V1
    assert key_columns([*KEY_COLUMNS_V1, "expect_abstain", "depth"]) == [
        *KEY_COLUMNS_V1, "expect_abstain",
    ]  # fmt: skip
    assert key_columns(reversed(KEY_COLUMNS_ALL)) == KEY_COLUMNS_ALL
    assert set(KEY_COLUMNS_V1) <= set(KEY_COLUMNS) <= set(KEY_COLUMNS_ALL)


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(max_size=200),
    outcome=st.sampled_from(["ok", "timeout", "transport_error"]),
    key=st.sampled_from([OPEN_TUMOR, OPEN_LATERALITY, ABSTAIN_MC]),
)
def test_grade_never_crashes_and_keeps_outcomes_apart(text, outcome, key) -> None:
    g = grade(outcome, text, key)
    assert g.outcome in ("answered", "abstained", "unparseable", "transport_error")
    assert (g.outcome == "transport_error") == (outcome != "ok")
    assert g.hallucinated in (-1, 0, 1)
    assert g.correct is False or g.outcome in ("answered", "abstained")
    assert -1 <= g.confidence <= 100


def test_optional_columns_flow_through_the_run_figures() -> None:
    graded = [
        grade("ok", text, OPEN_TUMOR) for text in ["No tumour.", "Yes, a big mass.", "UNSURE"]
    ]
    graded += [grade("ok", "UNSURE", ABSTAIN_MC), grade("ok", "Answer: A", ABSTAIN_MC)]
    keys = [OPEN_TUMOR] * 3 + [ABSTAIN_MC] * 2
    df = pd.DataFrame(
        [
            {"subject_id": f"s{i}", "task": k.task, "format": k.format, "outcome": g.outcome,
             "correct": g.correct, "confidence": g.confidence, "true_class": k.answer,
             "pred_class": g.pred_class, "hallucinated": g.hallucinated,
             "expect_abstain": k.expect_abstain, "is_control": k.is_control, **k.axes}
            for i, (g, k) in enumerate(zip(graded, keys, strict=True))
        ]
    )  # fmt: skip
    metrics, _ = compute_run_figures(
        df, "r", "m", final=False, n_resamples=0, seed=0, min_subjects=5
    )
    top = metrics[(metrics.task == "all") & (metrics.format == "all") & (metrics.group_axis == "")]
    value = dict(zip(top.metric, top.value, strict=True))
    assert value["hallucination_rate"] == 1 / 3  # of the three open replies, the mass
    assert value["abstention_appropriate"] == 1 / 2
    assert value["over_abstention"] == 1 / 3  # UNSURE on the open tumour question
