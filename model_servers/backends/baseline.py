"""The "Random" baseline (MedRCube's chance row): a uniform guess among the prompt's options.

It reads the options from the prompt the way a VLM sees them (lines such as ``A. axial`` or
``B) coronal``), picks one uniformly, states a uniform integer confidence 0-100, and writes the
answer as a VLM would. The draw is seeded from the configured seed and a stable hash of the prompt
and the image bytes, so replaying the same item gives the same answer, while a reordered or
rephrased variant gets an independent draw. No options in the prompt gives ``UNSURE``.
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass

import numpy as np

from model_servers.backends.base import (
    BackendSettings,
    FinishReason,
    GenerationInput,
    GenerationOutput,
    ModelInfo,
)

MODEL_NAME = "random-baseline"
MODEL_VERSION = "1"

# "A. axial", "B) coronal", "(C) sagittal", "D: FLAIR", "- E. none"; one option per line.
_OPTION_LINE = re.compile(r"^\s*(?:[-*]\s*)?\(?([A-Z])\s*[.):]\s+(\S.*?)\s*$")

_TEMPLATES = (
    "Answer: {letter}\nConfidence: {confidence}",
    "The image shows a single medical image slice.\nAnswer: {letter}\nConfidence: {confidence}",
    "Looking at the image, the best match is {letter} ({text}).\n"
    "Answer: {letter}\nConfidence: {confidence}",
    "Answer: {letter}. {text}\nConfidence: {confidence}",
)
_UNSURE_TEMPLATE = (
    "I cannot tell from the question which answers are allowed.\n"
    "Answer: UNSURE\nConfidence: {confidence}"
)

# A word and the whitespace after it: the baseline's stand-in for a token.
_PIECE = re.compile(r"\S+\s*")


@dataclass(frozen=True)
class Option:
    """One answer option as written in the prompt."""

    letter: str
    text: str


def parse_options(prompt: str) -> list[Option]:
    """The lettered options of ``prompt``, in letter order from A without gaps.

    Only the run of letters A, B, C, ... counts, so a stray line such as ``T. note`` or a second
    list further down does not add options. A repeated letter keeps its first line.
    """
    found: dict[str, str] = {}
    for line in prompt.splitlines():
        match = _OPTION_LINE.match(line)
        if match and match.group(1) not in found:
            found[match.group(1)] = match.group(2)
    options = []
    for offset in range(26):
        letter = chr(ord("A") + offset)
        if letter not in found:
            break
        options.append(Option(letter, found[letter]))
    return options


def item_seed(seed: int, prompt: str, images: list[bytes]) -> list[int]:
    """Seed material from the configured seed and a stable hash of the prompt and the images."""
    digest = hashlib.sha256()
    digest.update(prompt.encode("utf-8"))
    for image in images:
        digest.update(len(image).to_bytes(8, "big"))
        digest.update(image)
    raw = digest.digest()
    return [
        seed & 0xFFFFFFFFFFFFFFFF,
        *(int.from_bytes(raw[i : i + 8], "big") for i in (0, 8, 16, 24)),
    ]


def _count_pieces(text: str) -> int:
    return len(_PIECE.findall(text))


class RandomBackend:
    """Uniform guesses with uniform confidence; answers instantly and needs no model files."""

    name = "random"

    def __init__(self, settings: BackendSettings) -> None:
        self._seed = settings.seed
        self._latency_s = settings.latency_ms / 1000.0

    def load(self) -> None:
        """Nothing to load."""

    def describe(self) -> ModelInfo:
        return ModelInfo(MODEL_NAME, MODEL_VERSION, self.name, supports_logprobs=False)

    def generate(self, request: GenerationInput) -> GenerationOutput:
        if self._latency_s > 0:
            time.sleep(self._latency_s)
        rng = np.random.default_rng(item_seed(self._seed, request.prompt, request.images))
        options = parse_options(request.prompt)
        confidence = int(rng.integers(0, 101))
        if options:
            choice = options[int(rng.integers(0, len(options)))]
            template = _TEMPLATES[int(rng.integers(0, len(_TEMPLATES)))]
            text = template.format(letter=choice.letter, text=choice.text, confidence=confidence)
        else:
            text = _UNSURE_TEMPLATE.format(confidence=confidence)
        pieces = _PIECE.findall(text)
        finish: FinishReason = "stop"
        if len(pieces) > request.max_new_tokens:
            pieces = pieces[: request.max_new_tokens]
            finish = "length"
        return GenerationOutput(
            text="".join(pieces).rstrip(),
            prompt_token_count=_count_pieces(request.prompt) + len(request.images),
            completion_token_count=len(pieces),
            finish_reason=finish,
        )
