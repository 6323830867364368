"""Training data of the reference VLM: a benchmark's train items, their images as tensors, and
prompts rebuilt with freshly shuffled options.

Only items with ``split == "train"`` are used; the audit replays ``split == "audit"`` items of other
subjects, so the model never sees an audited subject. Each training step draws items and a new
option order, and rebuilds the item's prompt with :func:`benchmark.prompts.build_prompt` (same
task, phrasing and format), so the model learns to read the options rather than to remember one
letter per picture.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from benchmark.format import LETTERS, UNSURE
from benchmark.prompts import ITEM_FORMATS, PHRASINGS, QUESTIONS, TASK_OPTIONS, build_prompt
from benchmark.store import Benchmark

TRAIN_SPLIT = "train"


class NoTrainItems(ValueError):
    """A benchmark that holds no train items (or none this model can learn from)."""


@dataclass(frozen=True)
class Example:
    """One train item: which image, and the question asked about it."""

    image_index: int
    subject_id: str
    task: str
    item_format: str
    phrasing: str
    options: tuple[str, ...]
    answer: str


@dataclass(frozen=True)
class TrainSet:
    """The train items of a benchmark and the encoded images they ask about."""

    benchmark_id: str
    content_hash: str
    examples: list[Example]
    images: list[bytes]
    subjects: tuple[str, ...]

    @property
    def tasks(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for example in self.examples:
            counts[example.task] = counts.get(example.task, 0) + 1
        return dict(sorted(counts.items()))


def learnable(task: str, item_format: str, phrasing: str) -> bool:
    """Whether the model learns such items: multiple choice with a prompt that can be rebuilt
    here (known task and phrasing). Open-ended items are left out: their labels (``T1ce``) are
    several tokens, and the stated confidence is taught for one-token answers."""
    return (
        task in TASK_OPTIONS
        and item_format == "mc"
        and phrasing in PHRASINGS
        and (task, phrasing) in QUESTIONS
    )


def load_train_set(bench: Benchmark) -> TrainSet:
    """The train items of ``bench`` with their images; NoTrainItems when there are none."""
    frame = bench.items()
    if "split" not in frame.columns:
        raise NoTrainItems(
            f"benchmark {bench.id} has no 'split' column, so no train items; build one whose "
            "manifest marks train subjects (split == 'train')"
        )
    train = frame[frame["split"] == TRAIN_SPLIT]
    if train.empty:
        raise NoTrainItems(
            f"benchmark {bench.id} has no train items (split == 'train'); its splits: "
            + ", ".join(f"{k}={v}" for k, v in frame["split"].value_counts().items())
        )
    examples: list[Example] = []
    image_rows: dict[str, int] = {}
    images: list[bytes] = []
    for row in train.itertuples(index=False):
        task, item_format = str(row.task), str(row.format)
        phrasing = str(row.phrasing)
        if not row.image_path or not learnable(task, item_format, phrasing):
            continue
        expect_abstain = bool(getattr(row, "expect_abstain", False))
        answer = UNSURE if expect_abstain else str(row.answer)
        if answer != UNSURE and answer not in TASK_OPTIONS[task]:
            continue
        path = str(row.image_path)
        if path not in image_rows:
            image_rows[path] = len(images)
            images.append(bench.read_image(path))
        examples.append(
            Example(
                image_index=image_rows[path],
                subject_id=str(row.subject_id),
                task=task,
                item_format=item_format,
                phrasing=phrasing,
                options=tuple(row.options),
                answer=answer,
            )
        )
    if not examples:
        raise NoTrainItems(f"benchmark {bench.id} has train items, but none this model can learn")
    return TrainSet(
        benchmark_id=bench.id,
        content_hash=bench.content_hash,
        examples=examples,
        images=images,
        subjects=tuple(sorted({e.subject_id for e in examples})),
    )


def shuffled(
    example: Example, rng: np.random.Generator, canonical: bool = False
) -> tuple[str, str]:
    """The example's prompt with its options in a fresh random order (or, with ``canonical``, in
    the task's fixed order: an easier first lesson), and the target answer (the option's letter,
    or UNSURE)."""
    if canonical:
        order = list(TASK_OPTIONS[example.task])
    else:
        order = [example.options[i] for i in rng.permutation(len(example.options))]
    prompt = build_prompt(example.task, order, phrasing=example.phrasing, item_format="mc")
    answer = example.answer if example.answer == UNSURE else LETTERS[order.index(example.answer)]
    return prompt, answer


def answer_tokens() -> list[str]:
    """Every answer the model can give: the option letters of the longest task, and UNSURE."""
    longest = max(len(options) for options in TASK_OPTIONS.values())
    return [*LETTERS[:longest], UNSURE]


def tokenizer_corpus(repeat: int = 4) -> list[str]:
    """Lines the tokenizer is trained on: every prompt of every task and phrasing, every option
    line (each letter with each label), the chat roles, and every reply line, often enough that
    each line becomes one token (``Answer: B``, ``Confidence: 47``, ``B. coronal``)."""
    corpus: list[str] = ["USER: ", "ASSISTANT:"] * repeat
    for (task, phrasing), _ in QUESTIONS.items():
        for item_format in ITEM_FORMATS:
            corpus.append(
                build_prompt(task, TASK_OPTIONS[task], phrasing=phrasing, item_format=item_format)
            )
    labels = sorted({label for options in TASK_OPTIONS.values() for label in options})
    longest = max(len(options) for options in TASK_OPTIONS.values())
    for position in range(longest):
        corpus.extend([f"{LETTERS[position]}. {label}" for label in labels] * repeat)
    for answer in answer_tokens():
        corpus.extend([f"Answer: {answer}"] * repeat)
    for value in range(101):
        corpus.extend([f"Confidence: {value}"] * repeat)
    return corpus


def reply(answer: str, confidence: int) -> str:
    """The standard reply: ``Answer: X`` then ``Confidence: N``."""
    return f"Answer: {answer}\nConfidence: {confidence}"
