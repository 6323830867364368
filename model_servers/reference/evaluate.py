"""Offline evaluation of a saved model on one split of a benchmark, through the ``hf`` backend.

A quick check beside the audit (which is what counts): accuracy per task of the reply's letter,
the mean stated confidence, and the mean gap between the stated confidence and 100 times the
probability the model gives the answer it wrote (from the backend's per-token log-probabilities).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from benchmark.store import Benchmark

_REPLY = re.compile(r"Answer:\s*([A-Z]+)\s*\nConfidence:\s*(\d{1,3})")


@dataclass
class Evaluation:
    """Figures of one model on one split."""

    items: int = 0
    accuracy: dict[str, float] = field(default_factory=dict)
    chance: dict[str, float] = field(default_factory=dict)
    unparsed: int = 0
    mean_confidence: float = float("nan")
    mean_confidence_gap: float = float("nan")


def evaluate(
    model_dir: Path, bench: Benchmark, split: str = "audit", batch: int = 16
) -> Evaluation:
    """Answer every multiple-choice item of ``split`` greedily and score the letters."""
    from model_servers.backends import BackendSettings, GenerationInput, create_backend

    backend = create_backend("hf", BackendSettings(model_path=Path(model_dir), torch_threads=1))
    backend.load()
    items = bench.items()
    if "split" in items.columns:
        items = items[items["split"] == split]
    items = items[(items["format"] == "mc") & (items["image_path"] != "")]
    right: dict[str, list[bool]] = {}
    chance: dict[str, float] = {}
    confidences: list[float] = []
    gaps: list[float] = []
    result = Evaluation(items=len(items))
    rows = list(items.itertuples())
    for offset in range(0, len(rows), batch):
        chunk = rows[offset : offset + batch]
        requests = [
            GenerationInput(
                images=[bench.read_image(row.image_path)],
                media_types=[row.media_type],
                prompt=row.prompt,
                max_new_tokens=16,
                return_logprobs=True,
                request_id=row.item_id,
            )
            for row in chunk
        ]
        outputs = backend.generate_batch(requests)  # type: ignore[attr-defined]
        for row, output in zip(chunk, outputs, strict=True):
            chance[row.task] = 1.0 / len(row.options)
            match = _REPLY.search(output.text)
            if match is None:
                result.unparsed += 1
                right.setdefault(row.task, []).append(False)
                continue
            right.setdefault(row.task, []).append(match.group(1) == row.answer_letter)
            stated = int(match.group(2))
            confidences.append(stated)
            if output.logprobs:
                gaps.append(abs(stated - 100 * math.exp(output.logprobs[0][1])))
    result.accuracy = {task: sum(v) / len(v) for task, v in sorted(right.items())}
    result.chance = dict(sorted(chance.items()))
    if confidences:
        result.mean_confidence = sum(confidences) / len(confidences)
    if gaps:
        result.mean_confidence_gap = sum(gaps) / len(gaps)
    return result
