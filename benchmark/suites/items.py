"""Manifest rows of the brain-MRI protocol: one row per (image, task, format, phrasing).

An item id names its variant: ``<image variant>_<task>_<format>_<phrasing>``. A multiple-choice
item presents its task's options in an order drawn from the build seed and the item id
(:func:`option_order`) and records it in ``option_order``; an open-ended item records the task's
answer space in canonical order in ``options`` and has no letter or order. An item that expects
``UNSURE`` (the abstention prompt) has no answer letter.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmark import format as fmt
from benchmark.prompts import TASK_OPTIONS, build_prompt

HIERARCHY_OF: dict[str, str] = {
    "sequence": "low",
    "plane": "low",
    "is_brain": "low",
    "tumor_visible": "high",
    "laterality": "high",
    "abstention": "",
}
"""MedRCube task level of each task (the abstention prompt is outside the hierarchy)."""


@dataclass(frozen=True)
class Question:
    """One question about an image: its task and the right answer (``UNSURE`` to abstain)."""

    task: str
    answer: str

    @property
    def expect_abstain(self) -> bool:
        return self.answer == fmt.UNSURE


def option_order(seed: int, item_id: str, options: Iterable[str]) -> list[str]:
    """The presented order of a multiple-choice item's options, from the seed and the item id."""
    options = tuple(options)
    key = int.from_bytes(hashlib.sha256(item_id.encode()).digest()[:8], "big")
    order = np.random.default_rng([seed, 4, key]).permutation(len(options))
    return [options[i] for i in order]


def make_item(
    seed: int, item_id: str, question: Question, item_format: str, phrasing: str, base: Mapping
) -> dict[str, Any]:
    """One manifest row; ``base`` holds the image's columns (subject, path, labels, split...)."""
    canonical = TASK_OPTIONS[question.task]
    if item_format == "mc":
        options = option_order(seed, item_id, canonical)
        order = fmt.OPTION_SEPARATOR.join(options)
        answer_letter = (
            "" if question.expect_abstain else fmt.letter(options.index(question.answer))
        )
    else:
        options, order, answer_letter = list(canonical), "", ""
    return {
        "item_id": item_id,
        **base,
        "task": question.task,
        "format": item_format,
        "phrasing": phrasing,
        "prompt": build_prompt(question.task, options, phrasing=phrasing, item_format=item_format),
        "options": options,
        "answer": question.answer,
        "answer_letter": answer_letter,
        "option_order": order,
        "hierarchy": HIERARCHY_OF[question.task],
        "expect_abstain": question.expect_abstain,
    }


def image_items(
    seed: int,
    variant: str,
    questions: Iterable[Question],
    base: Mapping,
    formats: Iterable[str],
    phrasings: Iterable[str],
) -> list[dict[str, Any]]:
    """Every (question, format, phrasing) item about one image."""
    formats, phrasings = tuple(formats), tuple(phrasings)
    return [
        make_item(seed, f"{variant}_{q.task}_{f}_{p}", q, f, p, base)
        for q in questions
        for f in formats
        for p in phrasings
    ]
