"""The random baseline: option parsing, uniform choice, confidence range, reproducibility."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from model_servers.backends import BackendSettings, GenerationInput, create_backend
from model_servers.backends.baseline import Option, item_seed, parse_options

ANSWER = re.compile(r"^Answer: ([A-Z]|UNSURE)\b", re.MULTILINE)
CONFIDENCE = re.compile(r"^Confidence: (\d+)$", re.MULTILINE)


def ask(prompt: str, images: list[bytes] | None = None, seed: int = 0, max_new_tokens: int = 32):
    backend = create_backend("random", BackendSettings(seed=seed))
    backend.load()
    return backend.generate(
        GenerationInput(
            images=images or [],
            media_types=["image/png"] * len(images or []),
            prompt=prompt,
            max_new_tokens=max_new_tokens,
        )
    )


def plane_prompt(question: str) -> str:
    return f"{question}\nA. axial\nB) coronal\n(C) sagittal\nAnswer with a letter and a confidence."


def test_parse_options_reads_the_usual_option_styles() -> None:
    prompt = "Which sequence?\nA. T1\nB) T2\n  (C) FLAIR\nD: PD\n- E. DWI\nReply briefly."
    assert parse_options(prompt) == [
        Option("A", "T1"),
        Option("B", "T2"),
        Option("C", "FLAIR"),
        Option("D", "PD"),
        Option("E", "DWI"),
    ]


def test_parse_options_keeps_only_the_run_from_a() -> None:
    assert parse_options("Q?\nB. coronal\nC. sagittal") == []
    assert parse_options("Q?\nA. yes\nB. no\nD. stray") == [Option("A", "yes"), Option("B", "no")]
    assert parse_options("Q?\nA. yes\nA. again\nB. no") == [Option("A", "yes"), Option("B", "no")]


@pytest.mark.parametrize(
    "prompt",
    [
        "Describe the image.",
        "Is there a tumor? Answer yes or no.",
        "A lesion is seen.\nT2 weighted",  # a sentence that starts with "A" is no option
        "",
    ],
)
def test_no_options_answers_unsure(prompt: str) -> None:
    out = ask(prompt)
    assert ANSWER.search(out.text).group(1) == "UNSURE"  # type: ignore[union-attr]


def test_answer_is_an_offered_letter_with_integer_confidence() -> None:
    for i in range(200):
        out = ask(plane_prompt(f"Item {i}: which plane?"))
        assert ANSWER.search(out.text).group(1) in {"A", "B", "C"}  # type: ignore[union-attr]
        confidence = int(CONFIDENCE.search(out.text).group(1))  # type: ignore[union-attr]
        assert 0 <= confidence <= 100
        assert out.finish_reason == "stop"
        assert out.completion_token_count > 0 and out.prompt_token_count > 0
        assert out.logprobs == []


def test_choice_is_roughly_uniform_over_distinct_prompts() -> None:
    n = 3000
    counts = Counter(
        ANSWER.search(ask(plane_prompt(f"Item {i}?")).text).group(1)  # type: ignore[union-attr]
        for i in range(n)
    )
    assert set(counts) == {"A", "B", "C"}
    # Each share is 1/3; 5 standard deviations is about 0.043 at n=3000.
    for letter in "ABC":
        assert abs(counts[letter] / n - 1 / 3) < 0.045, counts


def test_confidence_covers_0_to_100_roughly_uniformly() -> None:
    values = [
        int(CONFIDENCE.search(ask(plane_prompt(f"Case {i}?")).text).group(1))  # type: ignore[union-attr]
        for i in range(3000)
    ]
    assert min(values) <= 2 and max(values) >= 98
    assert abs(sum(values) / len(values) - 50) < 3
    assert sum(v == 100 for v in values) > 0 or sum(v >= 95 for v in values) > 100


def test_same_prompt_and_image_replays_the_same_answer() -> None:
    prompt = plane_prompt("Which plane?")
    first = ask(prompt, [b"image-one"])
    assert ask(prompt, [b"image-one"]) == first
    texts = {ask(prompt, [f"image-{i}".encode()]).text for i in range(30)}
    assert len(texts) > 3, "different images should give independent draws"
    seeded = {ask(prompt, [b"image-one"], seed=s).text for s in range(30)}
    assert len(seeded) > 3, "the configured seed should change the draw"


def test_item_seed_is_stable_and_separates_images() -> None:
    assert item_seed(7, "p", [b"a", b"b"]) == item_seed(7, "p", [b"a", b"b"])
    assert item_seed(7, "p", [b"ab"]) != item_seed(7, "p", [b"a", b"b"])
    assert item_seed(7, "p", []) != item_seed(8, "p", [])


def test_token_limit_truncates_with_length_finish() -> None:
    out = ask(plane_prompt("Which plane?"), max_new_tokens=2)
    assert out.completion_token_count == 2
    assert out.finish_reason == "length"


def test_describe() -> None:
    info = create_backend("random", BackendSettings()).describe()
    assert (info.model_name, info.model_version, info.backend) == ("random-baseline", "1", "random")
    assert info.supports_logprobs is False
