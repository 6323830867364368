"""Grade recorded responses against a benchmark's answer key. Pure: rows in, rows out.

Multiple-choice items are read by ``parse_mc``, open-ended items (format ``open``) by
``parse_open``. Items that expect an abstention (``expect_abstain``, answer "UNSURE") are correct
exactly when the model abstained. For open-ended items whose key lists ``supported_findings``,
``hallucinated`` says whether the response asserted a finding the label does not support.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from benchmark.format import COLUMNS as MANIFEST_COLUMNS
from grader.findings import FINDINGS, asserted_findings, is_hallucination
from grader.parsing import Outcome, clean_text, parse_mc, parse_open

# Columns of the answer key that every benchmark (format version 1 on) has.
KEY_COLUMNS_V1 = [
    "item_id", "subject_id", "task", "format", "phrasing", "options", "answer", "answer_letter",
    "is_control", "modality", "anatomy", "dataset", "plane", "sequence",
]  # fmt: skip
# Columns format version 2 adds; read when present, defaulted when absent.
KEY_COLUMNS_V2 = [
    "hierarchy", "laterality", "supported_findings", "split", "image_missing", "expect_abstain",
]  # fmt: skip
KEY_COLUMNS_ALL = KEY_COLUMNS_V1 + KEY_COLUMNS_V2


def key_columns(available: Iterable[str]) -> list[str]:
    """The answer-key columns to read from a manifest that has the columns ``available``."""
    have = set(available)
    return [c for c in KEY_COLUMNS_ALL if c in have]


# The columns the grader reads: version 1's, plus those of version 2 that the installed
# benchmark format declares. Benchmarks on disk may be older: ask ``key_columns`` with a
# manifest's own columns to read only what it has.
KEY_COLUMNS = key_columns(KEY_COLUMNS_V1 + [c for c in KEY_COLUMNS_V2 if c in MANIFEST_COLUMNS])

# Axes a benchmark carries, graded as extra groupings.
GROUP_AXES = ("plane", "sequence", "modality", "anatomy", "dataset")

UNSURE = "UNSURE"
NOT_APPLICABLE = -1


@dataclass(frozen=True)
class KeyItem:
    """One item's answer key. Fields after ``axes`` are format version 2 and default when absent.

    ``supported_findings`` is None when the benchmark does not say (hallucination is then not
    graded), and a tuple (maybe empty) when it does.
    """

    subject_id: str
    task: str
    format: str
    phrasing: str
    options: tuple[str, ...]
    answer: str
    answer_letter: str
    is_control: bool
    axes: dict[str, str]
    hierarchy: str = ""
    laterality: str = ""
    supported_findings: tuple[str, ...] | None = None
    split: str = ""
    image_missing: bool = False
    expect_abstain: bool = False


@dataclass(frozen=True)
class Graded:
    """One graded response.

    ``hallucinated``: 1 when an open-ended response asserted an unsupported finding, 0 when it
    did not, -1 when not applicable (multiple choice, a transport error, or no supported
    findings in the key). ``findings``: what the response asserted (open-ended items only).
    """

    outcome: str
    letter: str
    confidence: int  # integer percent, -1 when missing
    correct: bool
    pred_class: str
    reason: str
    hallucinated: int = NOT_APPLICABLE
    findings: tuple[str, ...] = field(default=())


def letter_index(letter: str) -> int:
    return ord(letter.upper()) - ord("A")


# Findings an open answer implies by answering its question ("yes" to "is a tumour visible?").
_IMPLIED = {
    ("tumor_visible", "yes"): ("tumor",),
    ("laterality", "left"): ("laterality_left",),
    ("laterality", "right"): ("laterality_right",),
    ("laterality", "bilateral"): ("laterality_bilateral",),
}


def _open_findings(raw_text: str, key: KeyItem, label: str | None) -> tuple[str, ...]:
    found = set(asserted_findings(clean_text(raw_text)))
    if label is not None:
        found.update(_IMPLIED.get((key.task, label.casefold()), ()))
    return tuple(f for f in FINDINGS if f in found)


def grade(gateway_outcome: str, raw_text: str, key: KeyItem) -> Graded:
    """Grade one response. Transport errors and timeouts are kept apart, never 'wrong'."""
    if gateway_outcome != "ok":
        return Graded(Outcome.TRANSPORT_ERROR.value, "", -1, False, "", gateway_outcome)
    letter, hallucinated = "", NOT_APPLICABLE
    findings: tuple[str, ...] = ()
    if key.format == "open":
        parsed_open = parse_open(raw_text, key.options, key.task)
        outcome, confidence, reason = (
            parsed_open.outcome,
            parsed_open.confidence,
            parsed_open.reason,
        )
        pred = parsed_open.label or ""
        findings = _open_findings(raw_text, key, parsed_open.label)
        if key.supported_findings is not None:
            hallucinated = int(is_hallucination(findings, key.supported_findings))
    else:
        parsed = parse_mc(raw_text, key.options)
        outcome, confidence, reason = parsed.outcome, parsed.confidence, parsed.reason
        pred = ""
        if parsed.outcome is Outcome.ANSWERED and parsed.letter is not None:
            idx = letter_index(parsed.letter)
            pred = key.options[idx] if 0 <= idx < len(key.options) else ""
            letter = parsed.letter
    conf = -1 if confidence is None else int(confidence)
    if outcome is Outcome.ANSWERED and pred.casefold() == UNSURE.casefold():
        outcome, reason, pred, letter = Outcome.ABSTAINED, "unsure_option", "", ""
    if outcome is not Outcome.ANSWERED:
        correct = key.expect_abstain and outcome is Outcome.ABSTAINED
        return Graded(outcome.value, "", conf, correct, "", reason, hallucinated, findings)
    if key.expect_abstain:
        correct = False
    elif key.format == "open":
        correct = pred.casefold() == key.answer.casefold()
    else:
        correct = letter == key.answer_letter
    return Graded(
        Outcome.ANSWERED.value, letter, conf, correct, pred, reason, hallucinated, findings
    )


def _text(value: object, default: str = "") -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return default
    return str(value)


def _flag(value: object) -> bool:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return False
    return bool(value)


def _strings(value: object) -> tuple[str, ...] | None:
    if isinstance(value, list | tuple | np.ndarray):
        return tuple(str(v) for v in value)
    return None


def key_from_row(row: Mapping[str, object]) -> KeyItem:
    """A ``KeyItem`` from one manifest row; columns a benchmark lacks take their defaults."""
    return KeyItem(
        subject_id=_text(row.get("subject_id")),
        task=_text(row.get("task")),
        format=_text(row.get("format"), "mc"),
        phrasing=_text(row.get("phrasing")),
        options=_strings(row.get("options")) or (),
        answer=_text(row.get("answer")),
        answer_letter=_text(row.get("answer_letter")),
        is_control=_flag(row.get("is_control")),
        axes={axis: _text(row.get(axis)) for axis in GROUP_AXES},
        hierarchy=_text(row.get("hierarchy")),
        laterality=_text(row.get("laterality")),
        supported_findings=_strings(row.get("supported_findings")),
        split=_text(row.get("split")),
        image_missing=_flag(row.get("image_missing")),
        expect_abstain=_flag(row.get("expect_abstain")),
    )
