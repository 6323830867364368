"""The answer token's probability, found in the generated tokens."""

from __future__ import annotations

import math

import pandas as pd

from grader.token_confidence import SOURCE_AXIS, answer_token_confidence, token_figures


def test_letter_after_the_answer_label() -> None:
    tokens = [("Answer", math.log(0.9)), (": ", math.log(0.99)), ("B", math.log(0.7)),
              ("\nConfidence: 95", math.log(0.5))]  # fmt: skip
    assert answer_token_confidence(tokens, "B") == 70
    assert answer_token_confidence(tokens, "C") == -1  # not the letter it wrote


def test_one_token_per_line_and_bare_letters() -> None:
    # The reference model's tokenizer makes "Answer: B" a single token.
    assert answer_token_confidence([("Answer: B", math.log(0.42))], "B") == 42
    assert (
        answer_token_confidence([("The", -1.0), (" answer", -1.0), (" D", math.log(0.255))], "D")
        == 26
    )
    assert answer_token_confidence([], "A") == -1
    # An answer given by the option's text: the token where that text starts.
    tokens = [("it is", -1.0), (" sagit", math.log(0.3)), ("tal", -0.1)]
    assert answer_token_confidence(tokens, "C", "sagittal") == 30
    assert answer_token_confidence([("A", float("-inf"))], "A") == -1


def test_token_figures_sit_beside_the_stated_ones() -> None:
    rows = pd.DataFrame(
        {"subject_id": list("abcdef"), "task": "plane", "outcome": "answered",
         "correct": [True, True, False, True, False, True], "true_class": "axial",
         "pred_class": ["axial", "axial", "coronal", "axial", "sagittal", "axial"],
         "confidence": 90, "token_confidence": [80, 70, 60, 100, -1, 50]}
    )  # fmt: skip
    out = token_figures(rows, "r", "m", final=True, n_resamples=50, seed=[0, 1], min_subjects=5)
    value = dict(zip(out.metric, out.value, strict=True))
    assert set(out.group_axis) == {SOURCE_AXIS}
    assert out.response_count.iloc[0] == 5  # the row without a token probability is left out
    assert value["accuracy"] == 4 / 5
    assert math.isclose(value["mean_confidence"], (0.8 + 0.7 + 0.6 + 1.0 + 0.5) / 5)
    assert token_figures(rows.drop(columns="token_confidence"), "r", "m", final=True,
                         n_resamples=0, seed=[0], min_subjects=5).empty  # fmt: skip
