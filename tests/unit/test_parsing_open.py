"""Open-ended answers normalised to the answer space, and findings with negation scope."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grader.findings import (
    ASSERTED,
    FINDINGS,
    NEGATED,
    UNCERTAIN,
    asserted_findings,
    find_mentions,
    finding_status,
    is_hallucination,
)
from grader.parsing import Outcome, ParsedOpen, parse_open

SEQUENCE = ["T1", "T1ce", "T2", "FLAIR", "PD", "MRA", "DWI"]
PLANE = ["axial", "coronal", "sagittal"]
LATERALITY = ["left", "right", "bilateral", "none"]
YES_NO = ["yes", "no"]

ANSWERED, ABSTAINED, UNPARSEABLE = Outcome.ANSWERED, Outcome.ABSTAINED, Outcome.UNPARSEABLE

OPEN_CASES = [
    # Sequence aliases.
    ("T1", SEQUENCE, "sequence", ANSWERED, "T1"),
    ("T1-weighted", SEQUENCE, "sequence", ANSWERED, "T1"),
    ("This is a T1w image.", SEQUENCE, "sequence", ANSWERED, "T1"),
    ("t1 weighted", SEQUENCE, "sequence", ANSWERED, "T1"),
    ("post-contrast T1", SEQUENCE, "sequence", ANSWERED, "T1ce"),
    ("T1 with gadolinium", SEQUENCE, "sequence", ANSWERED, "T1ce"),
    ("T1-weighted post-contrast", SEQUENCE, "sequence", ANSWERED, "T1ce"),
    ("contrast-enhanced T1-weighted image", SEQUENCE, "sequence", ANSWERED, "T1ce"),
    ("T1+C", SEQUENCE, "sequence", ANSWERED, "T1ce"),
    ("T1ce", SEQUENCE, "sequence", ANSWERED, "T1ce"),
    ("T2-weighted", SEQUENCE, "sequence", ANSWERED, "T2"),
    ("T2-FLAIR", SEQUENCE, "sequence", ANSWERED, "FLAIR"),
    ("fluid-attenuated inversion recovery", SEQUENCE, "sequence", ANSWERED, "FLAIR"),
    ("proton density weighted", SEQUENCE, "sequence", ANSWERED, "PD"),
    ("diffusion-weighted imaging", SEQUENCE, "sequence", ANSWERED, "DWI"),
    ("MR angiography", SEQUENCE, "sequence", ANSWERED, "MRA"),
    ("Answer: FLAIR\nConfidence: 70", SEQUENCE, "sequence", ANSWERED, "FLAIR"),
    ('{"answer": "T2 weighted", "confidence": 0.6}', SEQUENCE, "sequence", ANSWERED, "T2"),
    ("<think>Maybe T1?</think>It is a T2 image.", SEQUENCE, "sequence", ANSWERED, "T2"),
    ("T1 or T2", SEQUENCE, "sequence", UNPARSEABLE, None),
    ("It looks like T2, not T1.", SEQUENCE, "sequence", ANSWERED, "T2"),
    # Plane.
    ("transverse", PLANE, "plane", ANSWERED, "axial"),
    ("An axial slice of the brain.", PLANE, "plane", ANSWERED, "axial"),
    ("Mid-sagittal view", PLANE, "plane", ANSWERED, "sagittal"),
    ("Coronal plane.", PLANE, "plane", ANSWERED, "coronal"),
    ("This is coronal, not sagittal.", PLANE, "plane", ANSWERED, "coronal"),
    ("axial or coronal", PLANE, "plane", UNPARSEABLE, None),
    # Laterality.
    ("left hemisphere", LATERALITY, "laterality", ANSWERED, "left"),
    ("The lesion is in the right frontal lobe.", LATERALITY, "laterality", ANSWERED, "right"),
    ("both sides", LATERALITY, "laterality", ANSWERED, "bilateral"),
    ("Bilateral.", LATERALITY, "laterality", ANSWERED, "bilateral"),
    ("There is no lesion.", LATERALITY, "laterality", ANSWERED, "none"),
    ("No tumor on the left.", LATERALITY, "laterality", ANSWERED, "none"),
    # Yes / no.
    ("no tumour", YES_NO, "tumor_visible", ANSWERED, "no"),
    ("normal", YES_NO, "tumor_visible", ANSWERED, "no"),
    ("No evidence of a tumor.", YES_NO, "tumor_visible", ANSWERED, "no"),
    ("Yes, there is a mass.", YES_NO, "tumor_visible", ANSWERED, "yes"),
    ("A large tumor is visible in the left hemisphere.", YES_NO, "tumor_visible", ANSWERED, "yes"),
    ("A tumor cannot be excluded.", YES_NO, "tumor_visible", ABSTAINED, None),
    ("This is not a brain MRI.", YES_NO, "is_brain", ANSWERED, "no"),
    ("It is an axial brain MRI.", YES_NO, "is_brain", ANSWERED, "yes"),
    ("random noise", YES_NO, "is_brain", ANSWERED, "no"),
    ("No.", YES_NO, "is_brain", ANSWERED, "no"),
    # Abstentions and nothing to read.
    ("UNSURE", SEQUENCE, "sequence", ABSTAINED, None),
    ("I cannot determine the sequence from this image.", SEQUENCE, "sequence", ABSTAINED, None),
    ("Answer: UNSURE\nConfidence: 5", PLANE, "plane", ABSTAINED, None),
    ("", PLANE, "plane", UNPARSEABLE, None),
    ("It is a medical image.", PLANE, "plane", UNPARSEABLE, None),
    # A task without aliases reads the labels themselves.
    ("the liver", ["liver", "spleen"], "organ", ANSWERED, "liver"),
]


@pytest.mark.parametrize(("text", "space", "task", "outcome", "label"), OPEN_CASES)
def test_parse_open_examples(text, space, task, outcome, label):
    parsed = parse_open(text, space, task)
    assert (parsed.outcome, parsed.label) == (outcome, label), parsed


def test_parse_open_reads_confidence_and_keeps_space_spelling():
    parsed = parse_open("Answer: t1ce\nConfidence: 85%", SEQUENCE, "sequence")
    assert parsed == ParsedOpen(ANSWERED, "T1ce", 85, "open_text")
    assert parse_open("FLAIR", SEQUENCE[:3], "sequence").outcome is UNPARSEABLE  # not offered


FINDING_CASES = [
    ("There is a large tumor.", {"tumor": ASSERTED}),
    ("No tumor.", {"tumor": NEGATED}),
    (
        "No tumor, edema or mass effect.",
        {"tumor": NEGATED, "edema": NEGATED, "mass_effect": NEGATED},
    ),
    ("Without edema.", {"edema": NEGATED}),
    ("Negative for necrosis.", {"necrosis": NEGATED}),
    ("Absence of enhancement.", {"enhancement": NEGATED}),
    ("Free of lesions.", {"lesion": NEGATED}),
    ("The lesion is absent.", {"lesion": NEGATED}),
    ("Tumor was ruled out.", {"tumor": NEGATED}),
    ("No tumor but there is edema.", {"tumor": NEGATED, "edema": ASSERTED}),
    ("No tumor. Edema is present.", {"tumor": NEGATED, "edema": ASSERTED}),
    # Pseudo-negations do not negate.
    ("Cannot exclude a small lesion.", {"lesion": UNCERTAIN}),
    ("A tumor is not ruled out.", {"tumor": UNCERTAIN}),
    ("A tumor cannot be excluded.", {"tumor": UNCERTAIN}),
    ("No change in the mass.", {"tumor": ASSERTED}),
    ("No significant change in the edema.", {"edema": ASSERTED}),
    ("Not only a tumor but also edema.", {"tumor": ASSERTED, "edema": ASSERTED}),
    # Hedges and refusals are not assertions.
    ("Possible necrosis.", {"necrosis": UNCERTAIN}),
    ("I cannot tell whether there is a tumor.", {"tumor": UNCERTAIN}),
    ("I am not sure if there is a lesion.", {"lesion": UNCERTAIN}),
    # Non-pathological descriptions.
    ("The left hemisphere looks normal.", {}),
    ("A T1 contrast-enhanced image of the brain.", {}),
    ("Axial T2 slice, ventricles and sulci are visible.", {}),
    # Laterality only next to a pathology.
    (
        "An enhancing mass in the left hemisphere with midline shift.",
        {
            "enhancement": ASSERTED,
            "tumor": ASSERTED,
            "laterality_left": ASSERTED,
            "mass_effect": ASSERTED,
        },
    ),  # fmt: skip
    ("Bilateral lesions.", {"laterality_bilateral": ASSERTED, "lesion": ASSERTED}),
]


@pytest.mark.parametrize(("text", "expected"), FINDING_CASES)
def test_finding_status_examples(text, expected):
    assert finding_status(text) == expected


def test_asserted_findings_in_vocabulary_order_and_hallucination():
    text = "Edema around a tumor in the right hemisphere; no necrosis."
    assert asserted_findings(text) == ("tumor", "edema", "laterality_right")
    assert is_hallucination(asserted_findings(text), ["tumor", "edema"])
    assert not is_hallucination(asserted_findings(text), ["tumor", "edema", "laterality_right"])
    assert not is_hallucination(asserted_findings("I cannot assess this image."), [])
    assert not is_hallucination(asserted_findings("Possible tumor."), [])
    assert not is_hallucination(asserted_findings("No tumor is seen."), [])


_VOCAB = st.sampled_from(
    [
        "no", "not", "without", "negative for", "absence of", "free of", "cannot exclude",
        "not ruled out", "no change in", "tumor", "tumour", "mass", "mass effect", "edema",
        "lesion", "left", "right", "both sides", "bilateral", "T1", "T1-weighted", "T1ce",
        "post-contrast", "with gadolinium", "FLAIR", "T2", "axial", "transverse", "yes", "UNSURE",
        "Answer:", "Confidence:", "85", "0.9", "%", ".", ",", ";", "\n", " ", "<think>",
        "</think>", "{", "}", '"answer": "', '"', "but", "there is", "whether", "brain", "normal",
    ]
)  # fmt: skip
_TEXT = st.one_of(st.text(max_size=300), st.lists(_VOCAB, max_size=40).map(" ".join))
_SPACE = st.one_of(
    st.sampled_from([SEQUENCE, PLANE, LATERALITY, YES_NO, []]),
    st.lists(st.text(max_size=12), max_size=8),
)
_TASK = st.sampled_from(["sequence", "plane", "laterality", "tumor_visible", "is_brain", "x", ""])


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_TEXT, space=_SPACE, task=_TASK)
def test_parse_open_never_crashes_and_is_well_formed(text, space, task):
    parsed = parse_open(text, space, task)
    assert parsed.outcome in (ANSWERED, ABSTAINED, UNPARSEABLE)
    assert (parsed.label is not None) == (parsed.outcome is ANSWERED)
    if parsed.label is not None:
        assert parsed.label in [str(s) for s in space]
    assert parsed.confidence is None or 0 <= parsed.confidence <= 100
    assert parsed.reason


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_TEXT)
def test_findings_never_crash_and_are_well_formed(text):
    for mention in find_mentions(text):
        assert mention.finding in FINDINGS
        assert mention.status in (ASSERTED, UNCERTAIN, NEGATED)
        assert 0 <= mention.start < mention.end <= len(text)
    assert set(asserted_findings(text)) <= set(FINDINGS)
