"""Grade recorded responses against a benchmark's answer key. Pure: rows in, rows out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from grader.parsing import Outcome, parse_mc

# Columns of the answer key the grader reads from a benchmark manifest.
KEY_COLUMNS = [
    "item_id", "subject_id", "task", "format", "phrasing", "options", "answer", "answer_letter",
    "is_control", "modality", "anatomy", "dataset", "plane", "sequence",
]  # fmt: skip

# Axes a benchmark carries, graded as extra groupings.
GROUP_AXES = ("plane", "sequence", "modality", "anatomy", "dataset")


@dataclass(frozen=True)
class KeyItem:
    """One item's answer key."""

    subject_id: str
    task: str
    format: str
    phrasing: str
    options: tuple[str, ...]
    answer: str
    answer_letter: str
    is_control: bool
    axes: dict[str, str]


@dataclass(frozen=True)
class Graded:
    """One graded response."""

    outcome: str
    letter: str
    confidence: int  # integer percent, -1 when missing
    correct: bool
    pred_class: str
    reason: str


def letter_index(letter: str) -> int:
    return ord(letter.upper()) - ord("A")


def grade(gateway_outcome: str, raw_text: str, key: KeyItem) -> Graded:
    """Grade one response. Transport errors and timeouts are kept apart, never 'wrong'."""
    if gateway_outcome != "ok":
        return Graded(Outcome.TRANSPORT_ERROR.value, "", -1, False, "", gateway_outcome)
    parsed = parse_mc(raw_text, key.options)
    confidence = -1 if parsed.confidence is None else int(parsed.confidence)
    if parsed.outcome is not Outcome.ANSWERED or parsed.letter is None:
        return Graded(parsed.outcome.value, "", confidence, False, "", parsed.reason)
    idx = letter_index(parsed.letter)
    pred = key.options[idx] if 0 <= idx < len(key.options) else ""
    return Graded(
        Outcome.ANSWERED.value,
        parsed.letter,
        confidence,
        parsed.letter == key.answer_letter,
        pred,
        parsed.reason,
    )


def key_from_row(row: dict[str, object]) -> KeyItem:
    options = row["options"]
    opts: Sequence[str] = list(options) if isinstance(options, list | tuple | np.ndarray) else []
    return KeyItem(
        subject_id=str(row["subject_id"]),
        task=str(row["task"]),
        format=str(row["format"]),
        phrasing=str(row["phrasing"]),
        options=tuple(str(o) for o in opts),
        answer=str(row["answer"]),
        answer_letter=str(row["answer_letter"]),
        is_control=bool(row["is_control"]),
        axes={axis: ("" if row.get(axis) is None else str(row.get(axis))) for axis in GROUP_AXES},
    )
