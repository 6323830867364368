"""Train the reference VLM: a small LLaVA (CLIP vision tower, Llama language model) that answers in
the standard format and states as its confidence the probability it gives its own answer.

How the stated confidence is made to equal the answer probability, with plain greedy decoding:

1. **Answer phase.** Teacher forcing on the ``Answer: <X>`` line after the served prompt (``X``
   the option letter, or UNSURE where the item expects abstention), with the options of every
   item shuffled afresh at every step (the first ``canonical_fraction`` of the steps keep each
   task's fixed option order: an easier first lesson in what the images show). The confidence line
   is taught only as "some number, then the end" (the probability mass on all 101 number tokens),
   so the format is there early.
2. **Confidence phase.** For every training input, a no-gradient pass reads the model's own
   distribution at the answer position: its greedy choice ``c`` and that choice's probability
   ``p``. The reply ``Answer: <c>\\nConfidence: <round(100 p)></s>`` is then taught, with a soft
   target over the 101 number tokens centred on ``round(100 p)``. The targets are recomputed at
   every step from the current weights, so they follow the model as it changes; some inputs get
   Gaussian noise so that the phase sees the whole range of ``p``, not only confident cases.
   The answer loss continues at a lower weight so answers do not drift.

The tokenizer is byte-level BPE over whole lines (it splits at line breaks only), trained on
Vigil's prompt lines and reply lines: a prompt is a few dozen tokens, each reply line
(``Answer: B``, ``Confidence: 47``) is one token, so ``p`` is one softmax entry and the number one
greedy step. The result is approximate: the card records the mean gap between the stated number
and ``100 p`` on the train items.

Deterministic for a seed as far as torch allows (fixed step counts; the time limit only cuts
short a run that would overrun it, and the card says so).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmark.store import Benchmark
from model_servers.reference.data import (
    Example,
    TrainSet,
    answer_tokens,
    load_train_set,
    reply,
    shuffled,
    tokenizer_corpus,
)

MODEL_NAME = "vigil-reference-vlm"


@dataclass(frozen=True)
class TrainConfig:
    """Sizes and schedule of a training run."""

    seed: int = 0
    image_size: int = 64
    patch_size: int = 16
    vision_hidden: int = 64
    vision_layers: int = 2
    text_hidden: int = 128
    text_layers: int = 2
    batch_size: int = 16
    answer_steps: int = 700
    confidence_steps: int = 250
    canonical_fraction: float = 0.2
    """Share of the answer steps (the first ones) whose options come in the task's fixed order."""
    learning_rate: float = 2e-3
    confidence_learning_rate: float = 1e-3
    minutes: float = 5.0
    torch_threads: int = 1
    vocab_size: int = 1024


@dataclass
class TrainReport:
    """What a run did; written into the model card and ``training.json``."""

    benchmark_id: str
    content_hash: str
    train_subjects: int
    train_items: int
    train_images: int
    tasks: dict[str, int]
    answer_steps: int = 0
    confidence_steps: int = 0
    seconds: float = 0.0
    cut_short: bool = False
    train_accuracy: dict[str, float] = field(default_factory=dict)
    mean_confidence_gap: float = float("nan")
    config: dict[str, Any] = field(default_factory=dict)


class Vocabulary:
    """Token ids of the reply lines: ``Answer: X``, the line break, ``Confidence: N``, ``</s>``."""

    def __init__(self, tokenizer: Any) -> None:
        import torch

        self.tokenizer = tokenizer
        self.eos = int(tokenizer.eos_token_id)
        self.answer_ids = {a: self._single(f"Answer: {a}") for a in answer_tokens()}
        self.newline = self._single("\n")
        self.number_ids = [self._single(f"Confidence: {n}") for n in range(101)]
        self.number_tensor = torch.tensor(self.number_ids)
        expected = [self.answer_ids["B"], self.newline, self.number_ids[47]]
        ids = tokenizer(reply("B", 47), add_special_tokens=False)["input_ids"]
        if ids != expected:
            raise RuntimeError(f"the reply does not tokenize line by line: {ids} != {expected}")

    def _single(self, line: str) -> int:
        ids = self.tokenizer(line, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise RuntimeError(f"{line!r} is not one token: {ids}")
        return int(ids[0])


def train_tokenizer(vocab_size: int) -> Any:
    """Byte-level BPE that splits at line breaks only, trained on Vigil's prompt and reply lines."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from model_servers.tiny import IMAGE_TOKEN, SPECIAL_TOKENS

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split("\n", behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(tokenizer_corpus(), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        extra_special_tokens={"image_token": IMAGE_TOKEN},
    )


def build_processor(config: TrainConfig) -> Any:
    """The tokenizer (trained on Vigil's prompts) and a CLIP image processor in one processor."""
    from transformers import LlavaProcessor

    from model_servers.tiny import CHAT_TEMPLATE, image_processor

    return LlavaProcessor(
        image_processor=image_processor(config.image_size),
        tokenizer=train_tokenizer(config.vocab_size),
        patch_size=config.patch_size,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=CHAT_TEMPLATE,
    )


def build_model(config: TrainConfig, tokenizer: Any) -> Any:
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
    )

    from model_servers.tiny import IMAGE_TOKEN

    vision = CLIPVisionConfig(
        image_size=config.image_size,
        patch_size=config.patch_size,
        hidden_size=config.vision_hidden,
        intermediate_size=config.vision_hidden * 2,
        num_hidden_layers=config.vision_layers,
        num_attention_heads=4,
        projection_dim=config.vision_hidden,
    )
    text = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.text_hidden,
        intermediate_size=config.text_hidden * 3,
        num_hidden_layers=config.text_layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    llava = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        image_seq_length=(config.image_size // config.patch_size) ** 2,
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
    )
    model = LlavaForConditionalGeneration(llava)
    model.generation_config.do_sample = False
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.max_new_tokens = 12
    return model


class Batches:
    """Token ids, labels and pixels of training batches, built the way the hf backend serves."""

    def __init__(self, processor: Any, train: TrainSet, config: TrainConfig) -> None:

        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.vocab = Vocabulary(self.tokenizer)
        self.train = train
        self.config = config
        image_tokens = (config.image_size // config.patch_size) ** 2
        self._image_text = processor.image_token * image_tokens
        self._prompt_cache: dict[str, list[int]] = {}
        import io

        from PIL import Image

        pil = [Image.open(io.BytesIO(data)).convert("RGB") for data in train.images]
        pixels = processor.image_processor(images=pil, return_tensors="pt")["pixel_values"]
        self.pixels = pixels.float()

    def prompt_ids(self, prompt: str) -> list[int]:
        """The ids the hf backend feeds the model for one image and ``prompt``."""
        ids = self._prompt_cache.get(prompt)
        if ids is None:
            content = [{"type": "image"}, {"type": "text", "text": prompt}]
            text = self.processor.apply_chat_template(
                [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
            )
            text = text.replace(self.processor.image_token, self._image_text)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            self._prompt_cache[prompt] = ids
        return ids

    def reply_ids(self, answer_id: int, number: int | None = None) -> list[int]:
        """``Answer: X`` and a line break; with a number, then ``Confidence: N`` and ``</s>``."""
        ids = [answer_id, self.vocab.newline]
        if number is not None:
            ids += [self.vocab.number_ids[number], self.vocab.eos]
        return ids

    def draw(
        self,
        rng: np.random.Generator,
        examples: list[Example] | None = None,
        canonical: bool = False,
    ) -> tuple[list[Example], list[str], list[str]]:
        """A batch of examples (random unless given) with freshly shuffled prompts."""
        if examples is None:
            picks = rng.integers(len(self.train.examples), size=self.config.batch_size)
            examples = [self.train.examples[int(i)] for i in picks]
        prompts, answers = [], []
        for example in examples:
            prompt, answer = shuffled(example, rng, canonical)
            prompts.append(prompt)
            answers.append(answer)
        return examples, prompts, answers

    def pixels_for(
        self, examples: list[Example], rng: np.random.Generator | None, noise: float = 0.0
    ) -> Any:
        """The examples' pixels; with ``rng``, shifted a few pixels, rescaled in intensity, and
        (for a share ``noise`` of them) blurred with Gaussian noise."""
        import torch

        pixels = self.pixels[[e.image_index for e in examples]].clone()
        if rng is None:
            return pixels
        for i in range(len(examples)):
            dy, dx = (int(v) for v in rng.integers(-3, 4, size=2))
            image = torch.roll(pixels[i], shifts=(dy, dx), dims=(1, 2))
            gain = float(rng.uniform(0.85, 1.15))
            image = (image + 1.0) * gain - 1.0
            if noise and rng.random() < noise:
                sigma = float(rng.uniform(0.2, 1.5))
                generator = torch.Generator().manual_seed(int(rng.integers(2**31)))
                image = image + sigma * torch.randn(image.shape, generator=generator)
            pixels[i] = image
        return pixels

    def tensors(self, prompts: list[str], replies: list[list[int]]) -> tuple[Any, Any, list[int]]:
        """Right-padded ids and attention mask, and where each reply starts."""
        import torch

        rows = [self.prompt_ids(p) + r for p, r in zip(prompts, replies, strict=True)]
        width = max(len(r) for r in rows)
        pad = int(self.tokenizer.pad_token_id)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
        starts = [len(self.prompt_ids(p)) for p in prompts]
        return ids, mask, starts


def _soft_number_target(number: int, sigma: float = 1.5) -> Any:
    """A distribution over 0-100 peaked at ``number``: near misses cost less than far ones."""
    import torch

    values = torch.arange(101, dtype=torch.float32)
    weights = torch.exp(-((values - number) ** 2) / (2 * sigma**2))
    return weights / weights.sum()


def _lr_at(step: int, total: int, peak: float) -> float:
    """Linear warm-up over the first tenth, then cosine decay to zero."""
    warm = max(1, total // 10)
    if step < warm:
        return peak * (step + 1) / warm
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm)))


def _own_answers(model: Any, batches: Batches, prompts: list[str], pixels: Any) -> Any:
    """The model's distribution over the first reply token for each prompt (no gradient)."""
    import torch

    placeholder = batches.reply_ids(batches.vocab.answer_ids["A"])
    ids, mask, starts = batches.tensors(prompts, [placeholder] * len(prompts))
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, pixel_values=pixels).logits
    rows = torch.arange(len(prompts))
    return torch.softmax(logits[rows, torch.tensor(starts) - 1].float(), dim=-1)


def train_reference_model(
    bench: Benchmark,
    out: Path,
    config: TrainConfig | None = None,
    progress: Callable[[str], None] | None = None,
) -> TrainReport:
    """Train on ``bench``'s train split and save the model, processor and card to ``out``."""
    config = config or TrainConfig()
    say = progress or (lambda _message: None)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    started = time.monotonic()
    budget = config.minutes * 60.0
    if config.torch_threads > 0:
        torch.set_num_threads(config.torch_threads)
    train = load_train_set(bench)
    report = TrainReport(
        benchmark_id=train.benchmark_id,
        content_hash=train.content_hash,
        train_subjects=len(train.subjects),
        train_items=len(train.examples),
        train_images=len(train.images),
        tasks=train.tasks,
        config=asdict(config),
    )
    say(
        f"train split of {bench.id}: {report.train_items} items, {report.train_images} images, "
        f"{report.train_subjects} subjects"
    )
    torch.manual_seed(config.seed)
    rng = np.random.default_rng([config.seed, 11])
    processor = build_processor(config)
    model = build_model(config, processor.tokenizer)
    batches = Batches(processor, train, config)
    vocab = batches.vocab
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=0.01)
    cross_entropy = torch.nn.functional.cross_entropy
    model.train()

    # Phase 1: answer lines.
    for step in range(config.answer_steps):
        if time.monotonic() > started + budget * 0.72:
            report.cut_short = True
            break
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(step, config.answer_steps, config.learning_rate)
        canonical = step < config.canonical_fraction * config.answer_steps
        examples, prompts, answers = batches.draw(rng, canonical=canonical)
        targets = [vocab.answer_ids[a] for a in answers]
        # The number is a placeholder here: only "some number, then the end" is taught.
        replies = [batches.reply_ids(t, 50) for t in targets]
        ids, mask, starts = batches.tensors(prompts, replies)
        logits = model(
            input_ids=ids, attention_mask=mask, pixel_values=batches.pixels_for(examples, rng)
        ).logits
        rows = torch.arange(len(starts))
        at = torch.tensor(starts) - 1
        n = len(starts)
        any_number = torch.logsumexp(
            torch.log_softmax(logits[rows, at + 2].float(), dim=-1)[:, vocab.number_tensor], dim=-1
        )
        loss = (
            cross_entropy(logits[rows, at], torch.tensor(targets))
            + cross_entropy(logits[rows, at + 1], torch.full((n,), vocab.newline))
            - any_number.mean()
            + cross_entropy(logits[rows, at + 3], torch.full((n,), vocab.eos))
        )
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        report.answer_steps = step + 1
        if step % 50 == 0 or step == config.answer_steps - 1:
            say(f"answer step {step + 1}/{config.answer_steps} loss {loss.item():.3f}")

    # Phase 2: the confidence line states the probability of the model's own answer.
    for step in range(config.confidence_steps):
        if time.monotonic() > started + budget * 0.95:
            report.cut_short = True
            break
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(step, config.confidence_steps, config.confidence_learning_rate)
        examples, prompts, answers = batches.draw(rng)
        pixels = batches.pixels_for(examples, rng, noise=0.4)
        model.eval()
        probs = _own_answers(model, batches, prompts, pixels)
        model.train()
        chosen = probs.argmax(dim=-1)
        numbers = [int(round(100 * float(probs[i, c]))) for i, c in enumerate(chosen.tolist())]
        replies = [
            batches.reply_ids(int(c), n) for c, n in zip(chosen.tolist(), numbers, strict=True)
        ]
        ids, mask, starts = batches.tensors(prompts, replies)
        logits = model(input_ids=ids, attention_mask=mask, pixel_values=pixels).logits
        rows = torch.arange(len(starts))
        at = torch.tensor(starts) - 1  # predicts the answer line
        number_logits = torch.log_softmax(logits[rows, at + 2].float(), dim=-1)[
            :, vocab.number_tensor
        ]
        soft = torch.stack([_soft_number_target(n) for n in numbers])
        number_loss = -(soft * number_logits).sum(dim=-1).mean()
        n = len(starts)
        format_loss = cross_entropy(
            logits[rows, at + 1], torch.full((n,), vocab.newline)
        ) + cross_entropy(logits[rows, at + 3], torch.full((n,), vocab.eos))
        true = torch.tensor([vocab.answer_ids[a] for a in answers])
        answer_loss = cross_entropy(logits[rows, at], true)
        loss = number_loss + format_loss + 0.3 * answer_loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        report.confidence_steps = step + 1
        if step % 25 == 0 or step == config.confidence_steps - 1:
            say(f"confidence step {step + 1}/{config.confidence_steps} loss {loss.item():.3f}")

    model.eval()
    report.seconds = round(time.monotonic() - started, 1)
    report.train_accuracy, report.mean_confidence_gap = _train_scores(model, batches, rng)
    say(
        f"trained in {report.seconds:.0f} s; train accuracy "
        + ", ".join(f"{k} {v:.2f}" for k, v in report.train_accuracy.items())
        + f"; mean |stated - 100 p| {report.mean_confidence_gap:.1f}"
    )
    save(model, processor, out, report)
    return report


def _train_scores(
    model: Any, batches: Batches, rng: np.random.Generator
) -> tuple[dict[str, float], float]:
    """Accuracy per task on the train items (one shuffled prompt each, greedy answer) and the
    mean gap between the stated number and 100 times the answer's probability."""
    import torch

    vocab = batches.vocab
    right: dict[str, list[bool]] = {}
    gaps: list[float] = []
    examples = batches.train.examples
    size = batches.config.batch_size * 2
    for offset in range(0, len(examples), size):
        chunk, prompts, answers = batches.draw(rng, examples[offset : offset + size])
        pixels = batches.pixels_for(chunk, None)
        probs = _own_answers(model, batches, prompts, pixels)
        chosen = probs.argmax(dim=-1).tolist()
        replies = [batches.reply_ids(c) for c in chosen]
        ids, mask, starts = batches.tensors(prompts, replies)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask, pixel_values=pixels).logits
        for i, start in enumerate(starts):
            right.setdefault(chunk[i].task, []).append(chosen[i] == vocab.answer_ids[answers[i]])
            stated = int(torch.argmax(logits[i, start + 1, vocab.number_tensor]))
            gaps.append(abs(stated - 100 * float(probs[i, chosen[i]])))
    accuracy = {task: float(np.mean(v)) for task, v in sorted(right.items())}
    return accuracy, float(np.mean(gaps)) if gaps else float("nan")


def save(model: Any, processor: Any, out: Path, report: TrainReport) -> None:
    """Write the model, its processor, ``training.json`` and the model card (README.md)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    (out / "training.json").write_text(json.dumps(asdict(report), indent=2, sort_keys=True) + "\n")
    (out / "README.md").write_text(model_card(report))


def model_card(report: TrainReport) -> str:
    accuracy = "\n".join(
        f"| {task} | {value:.3f} |" for task, value in report.train_accuracy.items()
    )
    tasks = ", ".join(f"{task} {count}" for task, count in report.tasks.items())
    config = report.config
    return f"""# {MODEL_NAME}

Vigil's reference vision-language model: a small LLaVA (CLIP vision tower on
{config.get("image_size")}x{config.get("image_size")} inputs, {config.get("vision_layers")} layers;
Llama language model, {config.get("text_layers")} layers of width {config.get("text_hidden")}),
trained from scratch by `vigil reference-model train`. It answers in Vigil's standard format
(`Answer: <letter>` / `Confidence: <0-100>`) and states as its confidence the probability it gives
its chosen answer, rounded to a whole percent (learned; see below). It is a test instrument for the
audit pipeline, not a clinical model.

## Training data

- benchmark: `{report.benchmark_id}`
- content hash: `{report.content_hash}`
- split: `train` only ({report.train_subjects} subjects, {report.train_items} items,
  {report.train_images} images); the audit split's subjects are never seen
- items per task: {tasks}

## Training

- answer steps: {report.answer_steps}; confidence steps: {report.confidence_steps}
  (batch {config.get("batch_size")}, seed {config.get("seed")}, {config.get("torch_threads")} torch threads)
- wall time: {report.seconds:.1f} s{" (cut short by the time limit)" if report.cut_short else ""}
- mean |stated confidence - 100 x answer probability| on the train items:
  {report.mean_confidence_gap:.1f} points

| task | train accuracy |
| --- | --- |
{accuracy}

The confidence phase teaches the reply `Confidence: round(100 p)`, where `p` is the model's own
probability of its greedy answer, recomputed at every step; served by plain greedy decoding, the
stated number tracks `p` to within the gap above.
"""
