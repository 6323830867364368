"""The probability a model gave its answer token, set beside the confidence it states.

A backend that offers per-token log-probabilities (the ``hf`` backend does) lets the grader ask
whether the stated confidence says more or less than the model's own probability of the letter it
chose. Pure functions: tokens in, numbers out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np
import pandas as pd

from grader.bootstrap import clustered_bootstrap
from grader.metrics import build_count_table, compute_metrics

# The group under which the answer-token figures are stored beside the stated-confidence ones.
SOURCE_AXIS = "confidence_source"
SOURCE_VALUE = "answer_token_prob"

_ANSWER = re.compile(r"answer\s*[:\-]?\s*\(?\**\s*([A-Z])\b", re.IGNORECASE)


def answer_token_confidence(
    logprobs: Sequence[tuple[str, float]], letter: str, option_text: str = ""
) -> int:
    """Integer percent probability of the token that carries the chosen answer; -1 if not found.

    The text is rebuilt from the tokens; the answer is the letter after the last "Answer:" label,
    else the letter's last standalone occurrence, else (an answer given by the option's text) the
    option text's last occurrence; its probability is that of the token where it starts.
    """
    if not logprobs or not letter:
        return -1
    text, spans = "", []
    for token, logprob in logprobs:
        spans.append((len(text), len(text) + len(token), logprob))
        text += token
    matches = [m for m in _ANSWER.finditer(text) if m.group(1).upper() == letter.upper()]
    if matches:
        pos = matches[-1].start(1)
    else:
        alone = [m.start() for m in re.finditer(rf"\b{re.escape(letter)}\b", text)]
        if not alone and option_text:
            pattern = rf"(?<!\w){re.escape(option_text)}(?!\w)"
            alone = [m.start() for m in re.finditer(pattern, text, re.IGNORECASE)]
        if not alone:
            return -1
        pos = alone[-1]
    for start, end, logprob in spans:
        if start <= pos < end:
            if not math.isfinite(logprob):
                return -1
            return int(min(100, max(0, math.floor(100 * math.exp(logprob) + 0.5))))
    return -1


def token_figures(
    rows: pd.DataFrame,
    run_id: str,
    model_name: str,
    *,
    final: bool,
    n_resamples: int,
    seed: Sequence[int],
    min_subjects: int,
) -> pd.DataFrame:
    """The run's metrics with the answer-token probability in place of the stated confidence.

    Only answered rows that have a token probability count; stored with group_axis
    ``confidence_source`` so that each figure sits beside its stated-confidence twin.
    """
    if "token_confidence" not in rows.columns:
        return pd.DataFrame()
    rows = rows[(rows["outcome"] == "answered") & (rows["token_confidence"] >= 0)]
    if rows.empty:
        return pd.DataFrame()
    table = build_count_table(
        pd.DataFrame(
            {
                "subject_id": rows["subject_id"].to_numpy(),
                "outcome": rows["outcome"].to_numpy(),
                "correct": rows["correct"].to_numpy(dtype=bool),
                "confidence": rows["token_confidence"].to_numpy(dtype=np.int64),
                "true_class": (rows["task"] + ":" + rows["true_class"]).to_numpy(),
                "pred_class": (rows["task"] + ":" + rows["pred_class"]).to_numpy(),
            }
        )
    )
    point = compute_metrics(table.counts.sum(axis=0), table.layout)
    n_subjects = int(rows["subject_id"].nunique())
    too_few = n_subjects < min_subjects
    intervals: dict[str, tuple[float, float]] = {}
    if final and n_resamples > 0 and not too_few:
        intervals = clustered_bootstrap(table, n_resamples=n_resamples, seed=list(seed))
    out = []
    for metric, value in point.items():
        lo, hi = intervals.get(metric, (math.nan, math.nan))
        has = bool(np.isfinite(lo) and np.isfinite(hi))
        out.append(
            {
                "run_id": run_id, "model_name": model_name, "task": "all", "format": "all",
                "group_axis": SOURCE_AXIS, "group_value": SOURCE_VALUE, "metric": metric,
                "value": float(value), "has_interval": has,
                "lower": float(lo) if has else None, "upper": float(hi) if has else None,
                "response_count": len(rows), "subject_count": n_subjects,
                "too_few_subjects": too_few, "final": final,
            }
        )  # fmt: skip
    return pd.DataFrame(out)
