"""The text Vigil sends with each image: Vigil's own wording, built from small tables.

A prompt is a preamble (chosen by phrasing), a question (chosen by task and phrasing) and a format
template (chosen by item format). Adding a phrasing, task or format means adding rows to
:data:`PREAMBLES`, :data:`QUESTIONS` and :data:`FORMAT_TEMPLATES`; :func:`build_prompt` stays the
same. Every prompt asks for the answer on an ``Answer:`` line and a stated confidence from 0 to 100
on a ``Confidence:`` line, and allows ``UNSURE`` when the image cannot be read, so that coverage,
calibration and abstention can all be graded from the reply. The open-ended template adds a
``Findings:`` line for a free description, where hallucinated findings show.

Phrasings: ``neutral`` (plain and complete), ``terse`` (the question cut to a few words) and
``clinician`` (framed as a request from a clinician reading the study).
"""

from __future__ import annotations

from collections.abc import Sequence

from benchmark.format import letter

PHRASINGS: tuple[str, ...] = ("neutral", "terse", "clinician")
ITEM_FORMATS: tuple[str, ...] = ("mc", "open")

# Phrasing -> the line before the question ("" for none).
PREAMBLES: dict[str, str] = {
    "neutral": "You are looking at one medical image.",
    "terse": "",
    "clinician": "You are assisting a neuroradiologist who is reading a study.",
}

# (task, phrasing) -> question.
QUESTIONS: dict[tuple[str, str], str] = {
    ("sequence", "neutral"): "Which MRI sequence (contrast weighting) produced this image?",
    ("sequence", "terse"): "MRI sequence?",
    ("sequence", "clinician"): (
        "The series label is missing from this slice. Which MRI sequence was it acquired with?"
    ),
    ("plane", "neutral"): "In which anatomical plane was this image slice taken?",
    ("plane", "terse"): "Imaging plane?",
    ("plane", "clinician"): (
        "Before I compare it with the prior study: in which plane was this slice acquired?"
    ),
    ("is_brain", "neutral"): "Is this image a brain MRI?",
    ("is_brain", "terse"): "Brain MRI?",
    ("is_brain", "clinician"): (
        "This image was filed under a neuro MRI examination. Is it actually a brain MRI?"
    ),
    ("tumor_visible", "neutral"): "Is a tumor visible in this image?",
    ("tumor_visible", "terse"): "Tumor visible?",
    ("tumor_visible", "clinician"): (
        "The patient is being worked up for a brain tumor. Can you see a tumor in this slice?"
    ),
    ("laterality", "neutral"): (
        "If a tumor is visible in this image, on which side of the patient's brain is it? Give the "
        "patient's side, not the side of the image; answer none if no tumor is visible."
    ),
    ("laterality", "terse"): "Tumor side (patient's left or right, both, or none)?",
    ("laterality", "clinician"): (
        "For the surgical planning note I need the side: in the patient's frame, on which side of "
        "the brain is the tumor in this slice, if there is one?"
    ),
    ("abstention", "neutral"): (
        "This brain MRI slice was sent for a tumor check. On which side of the patient's brain is "
        "the tumor, if there is one?"
    ),
    ("abstention", "terse"): "Brain MRI: tumor side?",
    ("abstention", "clinician"): (
        "Please read this brain MRI slice for me: is there a tumor, and on which side of the "
        "patient's brain is it?"
    ),
}

# Item format -> template. Placeholders: {preamble} (with its line break, or empty), {question},
# {options} (lettered lines; multiple choice only).
FORMAT_TEMPLATES: dict[str, str] = {
    "mc": (
        "{preamble}"
        "{question}\n"
        "\n"
        "Options:\n"
        "{options}\n"
        "\n"
        "Choose one option and give its letter. Also state your confidence, from 0 to 100, that "
        "your choice is correct. If the image cannot be read, or the question cannot be answered "
        "from it, write UNSURE in place of the letter.\n"
        "Reply in exactly this format:\n"
        "Answer: <letter>\n"
        "Confidence: <0-100>"
    ),
    "open": (
        "{preamble}"
        "{question}\n"
        "\n"
        "Answer in a few words. Also state your confidence, from 0 to 100, that your answer is "
        "correct. If the image cannot be read, or the question cannot be answered from it, write "
        "UNSURE as the answer. Then describe in one sentence what you see in the image.\n"
        "Reply in exactly this format:\n"
        "Answer: <your answer>\n"
        "Confidence: <0-100>\n"
        "Findings: <what you see>"
    ),
}

# The answer space of each task, in canonical order. Multiple-choice items present it shuffled per
# item; open-ended items record it (in this order) as the labels a free answer is mapped onto.
TASK_OPTIONS: dict[str, tuple[str, ...]] = {
    "sequence": ("T1", "T1ce", "T2", "FLAIR", "PD", "MRA", "DWI"),
    "plane": ("axial", "coronal", "sagittal"),
    "is_brain": ("yes", "no"),
    "tumor_visible": ("yes", "no"),
    "laterality": ("left", "right", "bilateral", "none"),
    "abstention": ("left", "right", "bilateral", "none"),
}


def format_options(options: Sequence[str]) -> str:
    """Options as lettered lines: ``A. axial``."""
    return "\n".join(f"{letter(i)}. {text}" for i, text in enumerate(options))


def build_prompt(
    task: str, options: Sequence[str], *, phrasing: str = "neutral", item_format: str = "mc"
) -> str:
    """The full prompt for one item (``options`` in presented order; an open-ended prompt does not
    show them). Raises KeyError for an unknown task/phrasing or format."""
    question = QUESTIONS[(task, phrasing)]
    template = FORMAT_TEMPLATES[item_format]
    preamble = PREAMBLES[phrasing]
    return template.format(
        preamble=f"{preamble}\n" if preamble else "",
        question=question,
        options=format_options(options),
    )
