"""The text Vigil sends with each image: Vigil's own wording, built from small tables.

A prompt is a question (chosen by task and phrasing) placed in a format template (chosen by item
format). Adding a phrasing or a format means adding rows to :data:`QUESTIONS` and
:data:`FORMAT_TEMPLATES`; :func:`build_prompt` stays the same. Every prompt asks for a stated
confidence from 0 to 100 and allows ``UNSURE``, so coverage, calibration and abstention can all be
graded from the reply.
"""

from __future__ import annotations

from collections.abc import Sequence

from benchmark.format import letter

# (task, phrasing) -> question.
QUESTIONS: dict[tuple[str, str], str] = {
    ("sequence", "neutral"): "Which MRI sequence (contrast weighting) produced this image?",
    ("plane", "neutral"): "In which anatomical plane was this image slice taken?",
    ("is_brain", "neutral"): "Is this image a brain MRI?",
    ("tumor_visible", "neutral"): "Is a tumor visible in this image?",
}

# Item format -> template. Placeholders: {question}, {options} (lettered lines).
FORMAT_TEMPLATES: dict[str, str] = {
    "mc": (
        "You are looking at one medical image.\n"
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
}

# Options each task offers, in canonical order (the presented order is shuffled per item).
TASK_OPTIONS: dict[str, tuple[str, ...]] = {
    "sequence": ("T1", "T1ce", "T2", "FLAIR", "PD", "MRA", "DWI"),
    "plane": ("axial", "coronal", "sagittal"),
    "is_brain": ("yes", "no"),
    "tumor_visible": ("yes", "no"),
}


def format_options(options: Sequence[str]) -> str:
    """Options as lettered lines: ``A. axial``."""
    return "\n".join(f"{letter(i)}. {text}" for i, text in enumerate(options))


def build_prompt(
    task: str, options: Sequence[str], *, phrasing: str = "neutral", item_format: str = "mc"
) -> str:
    """The full prompt for one item. Raises KeyError for an unknown task/phrasing or format."""
    question = QUESTIONS[(task, phrasing)]
    template = FORMAT_TEMPLATES[item_format]
    return template.format(question=question, options=format_options(options))
