"""Reading multiple-choice answers and stated confidences from raw VLM text."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from grader.parsing import LETTERS, Outcome, ParsedAnswer, parse_confidence, parse_mc

PLANE = ["axial", "coronal", "sagittal"]
SEQUENCE = ["T1", "T1ce", "T2", "FLAIR", "PD", "MRA", "DWI"]
YES_NO = ["yes", "no"]
LATERALITY = ["left", "right", "bilateral", "none"]

ANSWERED = Outcome.ANSWERED
ABSTAINED = Outcome.ABSTAINED
UNPARSEABLE = Outcome.UNPARSEABLE

# (text, options, outcome, letter, reason or None to skip checking it)
MC_CASES = [
    # The forms VLMs write.
    ("B", PLANE, ANSWERED, "B", "letter_line"),
    ("B.", PLANE, ANSWERED, "B", "letter_line"),
    ("(B)", PLANE, ANSWERED, "B", "letter_line"),
    ("b)", PLANE, ANSWERED, "B", "letter_line"),
    ("Answer: B", PLANE, ANSWERED, "B", "answer_label"),
    ("answer:b", PLANE, ANSWERED, "B", "answer_label"),
    ("ANSWER: (B)", PLANE, ANSWERED, "B", "answer_label"),
    ("Answer: [C]", PLANE, ANSWERED, "C", "answer_label"),
    ("**B. sagittal**", PLANE, ANSWERED, "B", "letter_line"),
    ("**Answer:** C", PLANE, ANSWERED, "C", "answer_label"),
    ("B) sagittal", PLANE, ANSWERED, "B", "letter_line"),
    ("B: coronal", PLANE, ANSWERED, "B", "letter_line"),
    ("B - coronal", PLANE, ANSWERED, "B", "letter_line"),
    ("A axial", PLANE, ANSWERED, "A", "letter_line"),
    ("Option B", PLANE, ANSWERED, "B", "letter_line"),
    ("The answer is B.", PLANE, ANSWERED, "B", "answer_phrase"),
    ("The correct option is (C).", PLANE, ANSWERED, "C", "answer_phrase"),
    ("I would choose B", PLANE, ANSWERED, "B", "answer_phrase"),
    ("The answer is likely C because the midline is visible.", PLANE, ANSWERED, "C", None),
    ('{"answer": "B", "confidence": 85}', PLANE, ANSWERED, "B", "json"),
    ('```json\n{"answer": "(C)", "confidence": 0.9}\n```', PLANE, ANSWERED, "C", "json"),
    ('{"Answer": "coronal"}', PLANE, ANSWERED, "B", "json"),
    ("\\boxed{C}", PLANE, ANSWERED, "C", "answer_label"),
    ("<answer>B</answer>", PLANE, ANSWERED, "B", "answer_label"),
    ("Final Answer:\n(C) sagittal", PLANE, ANSWERED, "C", "answer_label"),
    ("Answer: B. coronal\nConfidence: 80", PLANE, ANSWERED, "B", "answer_label"),
    ("Answer: B, Confidence: 80", PLANE, ANSWERED, "B", "answer_label"),
    ("B, 85", PLANE, ANSWERED, "B", "letter_line"),
    ("B 85%", PLANE, ANSWERED, "B", "letter_line"),
    ("B\nConfidence: 85", PLANE, ANSWERED, "B", "letter_line"),
    # Reasoning before a final answer; the last label wins.
    (
        "The slice shows both hemispheres side by side, which rules out A.\nAnswer: C\n"
        "Confidence: 90",
        PLANE,
        ANSWERED,
        "C",
        "answer_label",
    ),
    ("Answer: A\nWait, looking again at the ventricles.\nAnswer: B", PLANE, ANSWERED, "B", None),
    ("ASSISTANT: Answer: A Answer: B", PLANE, ANSWERED, "B", "answer_label"),
    ("The image is dark.\nC", PLANE, ANSWERED, "C", "letter_line"),
    # <think> blocks are stripped first, including unclosed and open-less ones.
    ("<think>It could be A or maybe C.</think>B", PLANE, ANSWERED, "B", None),
    ("<think>Answer: A</think>\nAnswer: C", PLANE, ANSWERED, "C", None),
    ("reasoning about A</think>\nAnswer: B", PLANE, ANSWERED, "B", None),
    ("Answer: B\n<think>truncated trace, Answer: A", PLANE, ANSWERED, "B", None),
    ("<think>\nreasoning cut off by the token limit: A", PLANE, UNPARSEABLE, None, "empty"),
    # The option text alone.
    ("sagittal", PLANE, ANSWERED, "C", "option_text"),
    ("Sagittal.", PLANE, ANSWERED, "C", "option_text"),
    ("I think it's coronal", PLANE, ANSWERED, "B", "option_text"),
    ("Answer: sagittal", PLANE, ANSWERED, "C", "answer_label"),
    ("Answer: FLAIR", SEQUENCE, ANSWERED, "D", "answer_label"),
    ("Answer: T1ce", SEQUENCE, ANSWERED, "B", "answer_label"),
    ("Answer: T1", SEQUENCE, ANSWERED, "A", "answer_label"),
    ("Answer: yes", YES_NO, ANSWERED, "A", "answer_label"),
    ("No, there is no tumor visible.", YES_NO, ANSWERED, "B", "option_text"),
    ("Answer: none", LATERALITY, ANSWERED, "D", "answer_label"),
    ("It is axial, not coronal", PLANE, UNPARSEABLE, None, "ambiguous_options"),
    # The article "A" is not the letter A.
    ("A T2 image shows bright CSF, so this is T2.", SEQUENCE, ANSWERED, "C", "option_text"),
    ("A sagittal slice is shown.", PLANE, ANSWERED, "C", "option_text"),
    ("Answer: A T2-weighted image", SEQUENCE, ANSWERED, "C", "answer_label"),
    ("the answer is a T2 image", SEQUENCE, ANSWERED, "C", "answer_phrase"),
    ("Answer: I think it's B", PLANE, ANSWERED, "B", "answer_label"),
    ("A", YES_NO, ANSWERED, "A", "letter_line"),
    # Two letters asserted as the answer.
    ("Answer: A or B", PLANE, UNPARSEABLE, None, "ambiguous_letters"),
    ("A and C", PLANE, UNPARSEABLE, None, "ambiguous_letters"),
    ("Answer: A/B", PLANE, UNPARSEABLE, None, "ambiguous_letters"),
    ("(A) or (B)", PLANE, UNPARSEABLE, None, "ambiguous_letters"),
    ("The answer is B or C.", PLANE, UNPARSEABLE, None, "ambiguous_letters"),
    ('{"answer": ["A", "C"]}', PLANE, UNPARSEABLE, None, "ambiguous_letters"),
    ("A. axial\nB. coronal\nC. sagittal\nI think it's C", PLANE, UNPARSEABLE, None, None),
    # A second letter that is not asserted as the answer.
    ("Answer: B (or possibly C)", PLANE, ANSWERED, "B", "answer_label"),
    ("Answer: B and I'm 90% sure", PLANE, ANSWERED, "B", "answer_label"),
    ("B and I am 90% sure", PLANE, ANSWERED, "B", "letter_line"),
    # Letters beyond the options are invalid.
    ("Answer: E", PLANE, UNPARSEABLE, None, "invalid_letter"),
    ("E", PLANE, UNPARSEABLE, None, "no_answer"),
    ("Answer: H", SEQUENCE, UNPARSEABLE, None, "invalid_letter"),
    ("Answer: G", SEQUENCE, ANSWERED, "G", "answer_label"),
    ("I", SEQUENCE, UNPARSEABLE, None, "no_answer"),
    # Abstentions and refusals.
    ("UNSURE", PLANE, ABSTAINED, None, "unsure"),
    ("unsure.", PLANE, ABSTAINED, None, "unsure"),
    ("Answer: UNSURE\nConfidence: 10", PLANE, ABSTAINED, None, "unsure"),
    ('{"answer": "UNSURE", "confidence": 5}', PLANE, ABSTAINED, None, "unsure"),
    ("I cannot determine the plane from this image.", PLANE, ABSTAINED, None, "unsure"),
    ("I'm unable to assess this image.", PLANE, ABSTAINED, None, "unsure"),
    ("I\u2019m unable to say.", PLANE, ABSTAINED, None, "unsure"),
    ("The sequence cannot be determined from this image.", SEQUENCE, ABSTAINED, None, "unsure"),
    ("The model is not able to assess this.", PLANE, ABSTAINED, None, "unsure"),
    ("Answer: cannot be determined", PLANE, ABSTAINED, None, "unsure"),
    (
        "I cannot tell from the question which answers are allowed.\nAnswer: UNSURE\nConfidence: 3",
        PLANE,
        ABSTAINED,
        None,
        "unsure",
    ),
    # An answer in an Answer: line beats an unsure remark elsewhere.
    ("Answer: B\nI am unsure about this.", PLANE, ANSWERED, "B", "answer_label"),
    ("I am not sure, but the answer is C.", PLANE, ANSWERED, "C", "answer_phrase"),
    # Nothing to read.
    ("", PLANE, UNPARSEABLE, None, "empty"),
    ("   \n  ", PLANE, UNPARSEABLE, None, "empty"),
    ("The image is a medical scan.", PLANE, UNPARSEABLE, None, "no_answer"),
    ("Answer: B", [], UNPARSEABLE, None, None),
]


@pytest.mark.parametrize(("text", "options", "outcome", "letter", "reason"), MC_CASES)
def test_parse_mc_examples(text, options, outcome, letter, reason):
    parsed = parse_mc(text, options)
    assert parsed.outcome is outcome, parsed
    assert parsed.letter == letter, parsed
    if reason is not None:
        assert parsed.reason == reason, parsed


def test_parse_mc_reads_confidence_with_the_answer():
    assert parse_mc("Answer: B\nConfidence: 85", PLANE) == ParsedAnswer(
        ANSWERED, "B", 85, "answer_label"
    )
    assert parse_mc('{"answer": "C", "confidence": 0.85}', PLANE).confidence == 85
    assert (
        parse_mc("<think>Confidence: 10</think>Answer: A\nConfidence: 70", PLANE).confidence == 70
    )


def test_letter_without_confidence_is_answered_with_none():
    parsed = parse_mc("Answer: A", PLANE)
    assert parsed.outcome is ANSWERED
    assert parsed.confidence is None
    assert parsed.index == 0


CONFIDENCE_CASES = [
    ("Confidence: 85", 85),
    ("confidence 85%", 85),
    ("CONFIDENCE: 85 %", 85),
    ("85%", 85),
    ("Confidence: 0.85", 85),
    ("Confidence: .85", 85),
    ("85/100", 85),
    ("Confidence: 85/100", 85),
    ("Confidence: 8/10", 80),
    ('{"answer": "B", "confidence": 85}', 85),
    ('{"answer": "B", "confidence": 0.85}', 85),
    ('{"confidence": "85%"}', 85),
    ('{"confidence_score": 0.7}', 70),
    ("Confidence level: 60", 60),
    ("My confidence is about 75%.", 75),
    ("Confidence (0-100): 70", 70),
    ("Confidence 0-100: 70", 70),
    ("I am 90% confident", 90),
    ("Answer: B\nConfidence: 100", 100),
    ("Confidence: 0", 0),
    ("Confidence: 1", 1),  # no decimal point: a percent, not a fraction
    ("Confidence: 1.0", 100),  # a decimal point and <= 1: a fraction
    ("Confidence: 0.0", 0),
    ("Confidence: 100.0", 100),
    ("Confidence: 85.", 85),
    # Round half up on the exact decimal (0.285 * 100 is 28.499999... in binary floating point).
    ("Confidence: 85.5", 86),
    ("Confidence: 0.285", 29),
    ("Confidence: 0.125", 13),
    ("Confidence: 84.4", 84),
    # Out of range.
    ("Confidence: 150", None),
    ("Confidence: -5", None),
    ("Confidence: 100.4", None),
    ("Confidence: 101%", None),
    # A labelled value wins over any percentage elsewhere.
    ("About 10% of slices look like this.\nConfidence: 70", 70),
    ("Confidence: high (90%)", 90),
    # Several unlabelled percentages are ambiguous; one repeated value is not.
    ("10% or 20%", None),
    ("90% ... I said 90%", 90),
    ("Confidence: 70-80", None),
    ("Confidence: 85th percentile", None),
    ("", None),
    ("Answer: B", None),
    ("Give a confidence from 0 to 100.", None),
    ("<think>Confidence: 20</think>Confidence: 60", 60),
    ("<think>Confidence: 20</think>Answer: B", None),
]


@pytest.mark.parametrize(("text", "expected"), CONFIDENCE_CASES)
def test_parse_confidence_examples(text, expected):
    assert parse_confidence(text) == expected


# Hypothesis: nothing crashes, and the result is always well formed.

_VOCAB = st.sampled_from(
    [
        "A", "B", "C", "D", "E", "I", "a", "b", "Answer:", "answer is", "Final Answer:",
        "Confidence:", "confidence", "UNSURE", "unsure", "cannot determine", "or", "and", "/",
        "(", ")", "[", "]", "{", "}", '"', "'", ".", ",", ":", "%", "/100", "0.85", "85", "150",
        "-5", "1.0", "\n", " ", "<think>", "</think>", "**", "`", "\\boxed{", "<answer>",
        "</answer>", "axial", "coronal", "sagittal", "T1", "T2", "yes", "no", "\u212a", "\u017f",
        '{"answer": "', '"confidence": ', "Option", "I'm", "\u2019",
    ]
)  # fmt: skip
_TEXT = st.one_of(st.text(max_size=300), st.lists(_VOCAB, max_size=40).map("".join))
_OPTIONS = st.one_of(
    st.lists(st.text(max_size=20), max_size=30),
    st.lists(
        st.sampled_from(["axial", "coronal", "sagittal", "T1", "a", "A", "", "yes"]), max_size=8
    ),
)


def _check_well_formed(parsed: ParsedAnswer, options: list[str]) -> None:
    assert isinstance(parsed, ParsedAnswer)
    assert parsed.outcome in (ANSWERED, ABSTAINED, UNPARSEABLE)
    assert isinstance(parsed.reason, str) and parsed.reason
    if parsed.outcome is ANSWERED:
        assert parsed.letter is not None
        assert parsed.letter in LETTERS[: min(len(options), 26)]
    else:
        assert parsed.letter is None
    assert parsed.confidence is None or (
        isinstance(parsed.confidence, int) and 0 <= parsed.confidence <= 100
    )


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_TEXT, options=_OPTIONS)
@example(text="Answer: \u212a", options=["x"] * 11)
@example(text="\u017f)", options=["x"] * 20)
@example(text="A" * 200 + " or " * 50, options=["a"] * 26)
def test_parse_mc_never_crashes_and_is_well_formed(text, options):
    _check_well_formed(parse_mc(text, options), options)


@settings(max_examples=1500, deadline=None)
@given(text=_TEXT)
def test_parse_confidence_never_crashes(text):
    value = parse_confidence(text)
    assert value is None or (isinstance(value, int) and 0 <= value <= 100)


@settings(max_examples=300, deadline=None)
@given(
    n_options=st.integers(1, 26),
    pick=st.integers(0, 25),
    confidence=st.integers(0, 100),
    template=st.sampled_from(
        [
            "Answer: {L}\nConfidence: {c}",
            "{L}\nConfidence: {c}%",
            "({L}) {t}\nConfidence: {c}",
            '{{"answer": "{L}", "confidence": {c}}}',
            "Some reasoning first.\nAnswer: {L}. {t}\nConfidence: {c}/100",
            "<think>Maybe B, maybe A.</think>The answer is {L}. Confidence: {c}",
        ]
    ),
)
def test_well_formed_answers_round_trip(n_options, pick, confidence, template):
    options = [f"option{i}" for i in range(n_options)]
    index = pick % n_options
    letter = LETTERS[index]
    text = template.format(L=letter, t=options[index], c=confidence)
    parsed = parse_mc(text, options)
    assert (parsed.outcome, parsed.letter, parsed.confidence) == (ANSWERED, letter, confidence)


# The answer forms of Vigil's own Random baseline (model_servers/backends/baseline.py).
@pytest.mark.parametrize(
    "template",
    [
        "Answer: {L}\nConfidence: {c}",
        "The image shows a single medical image slice.\nAnswer: {L}\nConfidence: {c}",
        "Looking at the image, the best match is {L} ({t}).\nAnswer: {L}\nConfidence: {c}",
        "Answer: {L}. {t}\nConfidence: {c}",
    ],
)
@pytest.mark.parametrize("index", range(len(SEQUENCE)))
def test_baseline_answers(template, index):
    text = template.format(L=LETTERS[index], t=SEQUENCE[index], c=index * 15)
    assert parse_mc(text, SEQUENCE) == ParsedAnswer(
        ANSWERED, LETTERS[index], index * 15, "answer_label"
    )
