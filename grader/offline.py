"""``vigil grade``: grade a file of responses against a benchmark, with no service running.

A team that collected responses with another harness grades them the way the grader does:
the same parsers, the same answer key, the same count tables, metrics and subject-clustered
intervals. Nothing is stored; the figures are printed as a table or, with ``--json``, as JSON.

The responses file is Parquet (``.parquet``) or JSON Lines (``.jsonl``, ``.ndjson``; one object
per line). Columns:

- ``item_id`` (required): the benchmark item the response answers;
- ``raw_text`` (required): the model's text, as it came back (null reads as "");
- ``outcome`` (optional): the transport outcome, ``ok`` (the default), ``timeout`` or
  ``transport_error``; the last two are kept apart from the model's answers, as in the grader;
- ``model``, ``run`` (optional): who answered and in which run. Different models or runs are
  never pooled: each (model, run) gets its own figures;
- ``variant`` (optional): a free label for how the item was asked (e.g. ``text_only``); a
  ``--group-by`` axis;
- ``format`` (optional): ``mc`` or ``open``, how to read the text when the harness asked an item
  in another format than the benchmark's; by default the item's own format;
- ``phrasing`` (optional): the prompt phrasing, when the harness used its own; a grouping axis.

``--group-by AXIS`` adds groups by one axis (repeat it for several; ``task,format`` crosses two).
Axes: ``task``, ``format``, ``phrasing``, ``variant``, and what the benchmark carries (``plane``,
``sequence``, ``modality``, ``anatomy``, ``dataset``, and in format version 2 ``hierarchy``,
``laterality``, ``split``). Bad input (an unreadable file, a missing column, an unknown item id,
an unknown outcome or format) is one line naming the file, the row and the field; exit code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from cli.common import UsageError
from grader.bootstrap import MIN_SUBJECTS, clustered_bootstrap
from grader.grading import KeyItem, grade, key_from_row
from grader.metrics import METRIC_NAMES, build_count_table, compute_metrics

REQUIRED = ("item_id", "raw_text")
OPTIONAL = ("outcome", "model", "run", "variant", "format", "phrasing")
GATEWAY_OUTCOMES = ("ok", "timeout", "transport_error")
FORMATS = ("mc", "open")
KEY_AXES = (
    "plane", "sequence", "modality", "anatomy", "dataset", "hierarchy", "laterality", "split",
)  # fmt: skip
AXES = ("task", "format", "phrasing", "variant", *KEY_AXES)
PARQUET_SUFFIXES = (".parquet", ".pq")
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")


# ---------------------------------------------------------------------------------------------
# Reading


def read_responses(path: Path) -> pd.DataFrame:
    """The responses file as a frame with every column of REQUIRED and OPTIONAL (as strings).

    Raises UsageError naming the file, the row (1-based line of a JSONL file, 1-based row of a
    Parquet file) and the field for anything it cannot read.
    """
    suffix = path.suffix.lower()
    if suffix not in PARQUET_SUFFIXES + JSONL_SUFFIXES:
        raise UsageError(f"{path}: unknown responses format {suffix!r}; use .parquet or .jsonl")
    try:
        frame = _read_parquet(path) if suffix in PARQUET_SUFFIXES else _read_jsonl(path)
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror or exc}") from None
    missing = [c for c in REQUIRED if c not in frame.columns]
    if missing:
        raise UsageError(f"{path}: missing column(s) {', '.join(missing)}")
    out = pd.DataFrame(index=frame.index)
    for column in (*REQUIRED, *OPTIONAL):
        if column in frame.columns:
            values = frame[column]
            out[column] = [None if _is_missing(v) else str(v) for v in values]
        else:
            out[column] = None
    for i, value in enumerate(out["item_id"], start=1):
        if value is None or not value.strip():
            raise UsageError(f"{path}: row {i}: field item_id is empty")
    out["raw_text"] = out["raw_text"].fillna("")
    out["outcome"] = out["outcome"].fillna("ok")
    for i, (outcome, fmt) in enumerate(zip(out["outcome"], out["format"], strict=True), 1):
        if outcome not in GATEWAY_OUTCOMES:
            raise UsageError(
                f"{path}: row {i}: field outcome is {outcome!r}; expected one of "
                f"{', '.join(GATEWAY_OUTCOMES)}"
            )
        if fmt is not None and fmt not in FORMATS:
            raise UsageError(
                f"{path}: row {i}: field format is {fmt!r}; expected {' or '.join(FORMATS)}"
            )
    return out.reset_index(drop=True)


def _is_missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _read_parquet(path: Path) -> pd.DataFrame:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pandas()
    except (pa.ArrowException, ValueError) as exc:
        raise UsageError(f"{path}: not a readable Parquet file: {exc}") from None


def _read_jsonl(path: Path) -> pd.DataFrame:
    records: list[dict[str, Any]] = []
    with path.open("r", encoding="utf-8", errors="strict") as lines:
        try:
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError as exc:
                    raise UsageError(f"{path}: line {number}: invalid JSON ({exc})") from None
                if not isinstance(record, dict):
                    raise UsageError(f"{path}: line {number}: expected a JSON object")
                records.append(record)
        except UnicodeDecodeError:
            raise UsageError(f"{path}: not UTF-8 text") from None
    if not records:
        raise UsageError(f"{path}: no responses")
    return pd.DataFrame.from_records(records)


# ---------------------------------------------------------------------------------------------
# Grading (pure)


def grade_responses(
    responses: pd.DataFrame, key: dict[str, KeyItem], source: str = "responses"
) -> pd.DataFrame:
    """One graded row per response, with the columns the count table and the groupings read.

    Raises UsageError naming ``source`` and the rows whose item id is not in ``key``.
    """
    unknown = [(i, item) for i, item in enumerate(responses["item_id"], start=1) if item not in key]
    if unknown:
        shown = ", ".join(f"row {i} ({item!r})" for i, item in unknown[:5])
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise UsageError(
            f"{source}: {len(unknown)} response(s) name an item_id the benchmark does not have: "
            f"{shown}{more}"
        )
    rows: list[dict[str, object]] = []
    for r in responses.itertuples(index=False):
        item = key[str(r.item_id)]
        if r.format is not None and r.format != item.format:
            item = dataclasses.replace(item, format=str(r.format))
        g = grade(str(r.outcome), str(r.raw_text), item)
        rows.append(
            {
                "model": r.model or "", "run": r.run or "", "variant": r.variant or "",
                "phrasing": r.phrasing or item.phrasing, "format": item.format,
                "task": item.task, "subject_id": item.subject_id, "outcome": g.outcome,
                "correct": g.correct, "confidence": g.confidence,
                "true_class": f"{item.task}:{item.answer}",
                "pred_class": f"{item.task}:{g.pred_class}" if g.pred_class else "",
                "hallucinated": g.hallucinated, "expect_abstain": item.expect_abstain,
                "is_control": item.is_control, "hierarchy": item.hierarchy,
                "laterality": item.laterality, "split": item.split, **item.axes,
            }
        )  # fmt: skip
    return pd.DataFrame(rows)


def _group_masks(
    graded: pd.DataFrame, group_by: Sequence[str]
) -> Iterator[tuple[dict[str, str], pd.Series]]:
    """({axis: value}, row mask) per group: all rows of a (model, run), then each --group-by."""
    for (model, run), part in graded.groupby(["model", "run"], sort=True):
        head = {k: v for k, v in (("model", str(model)), ("run", str(run))) if v}
        yield head, graded.index.isin(part.index)
        for spec in group_by:
            axes = spec.split(",")
            for values, sub in part.groupby(axes, sort=True):
                labels = values if isinstance(values, tuple) else (values,)
                if any(str(v) == "" for v in labels):
                    continue  # rows that do not carry the axis
                named = {**head, **{a: str(v) for a, v in zip(axes, labels, strict=True)}}
                yield named, graded.index.isin(sub.index)


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def offline_figures(
    graded: pd.DataFrame,
    group_by: Sequence[str] = (),
    n_resamples: int = 1000,
    seed: int = 0,
    method: str = "percentile",
    min_subjects: int = MIN_SUBJECTS,
) -> list[dict[str, Any]]:
    """Every metric per group, with subject-clustered intervals where there are enough subjects.

    Each group is a dict: ``group`` ({axis: value}), ``response_count``, ``subject_count``,
    ``too_few_subjects``, and ``metrics`` ({name: {"value", "lower", "upper"}}, None for NaN).
    """
    for spec in group_by:
        bad = [a for a in spec.split(",") if a not in AXES]
        if bad:
            raise UsageError(f"unknown --group-by axis {bad[0]!r}; choose from {', '.join(AXES)}")
    out: list[dict[str, Any]] = []
    for group, mask in _group_masks(graded, group_by):
        sub = graded[mask]
        table = build_count_table(sub)
        point = compute_metrics(table.totals(), table.layout)
        too_few = table.n_subjects < min_subjects
        intervals: dict[str, tuple[float, float]] = {}
        if n_resamples > 0 and not too_few:
            intervals = clustered_bootstrap(
                table,
                n_resamples=n_resamples,
                seed=seed,
                method=method,  # type: ignore[arg-type]
            )
        nan = (math.nan, math.nan)
        out.append(
            {
                "group": group,
                "response_count": len(sub),
                "subject_count": table.n_subjects,
                "too_few_subjects": too_few,
                "metrics": {
                    name: {
                        "value": _finite(float(point[name])),
                        "lower": _finite(intervals.get(name, nan)[0]),
                        "upper": _finite(intervals.get(name, nan)[1]),
                    }
                    for name in METRIC_NAMES
                },
            }
        )
    return out


# ---------------------------------------------------------------------------------------------
# Printing


def _label(group: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in group.items()) or "all responses"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def format_table(figures: list[dict[str, Any]]) -> str:
    """One block per group: each metric with its value and 95% interval."""
    width = max(len(name) for name in METRIC_NAMES)
    blocks: list[str] = []
    for fig in figures:
        note = " (too few subjects for intervals)" if fig["too_few_subjects"] else ""
        lines = [
            f"{_label(fig['group'])}: {fig['response_count']} responses, "
            f"{fig['subject_count']} subjects{note}"
        ]
        for name, m in fig["metrics"].items():
            interval = ""
            if m["lower"] is not None and m["upper"] is not None:
                interval = f"  [{m['lower']:.3f}, {m['upper']:.3f}]"
            lines.append(f"  {name:<{width}}  {_number(m['value']):>6}{interval}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


# ---------------------------------------------------------------------------------------------
# The command


def cmd_grade(args: argparse.Namespace) -> int:
    from benchmark.store import default_root, open_benchmark

    if args.resamples < 0:
        raise UsageError(f"--resamples must be 0 or more, got {args.resamples}")
    responses_path = Path(args.responses)
    if not responses_path.is_file():
        raise UsageError(f"{responses_path}: no such file")
    root = Path(args.root) if args.root is not None else default_root()
    bench = open_benchmark(args.benchmark, root)
    manifest = bench.items()
    key = {str(row["item_id"]): key_from_row(row) for row in manifest.to_dict("records")}
    responses = read_responses(responses_path)
    if responses.empty:
        raise UsageError(f"{responses_path}: no responses")
    graded = grade_responses(responses, key, str(responses_path))
    figures = offline_figures(
        graded, args.group_by, n_resamples=args.resamples, seed=args.seed, method=args.interval
    )
    if args.json:
        document = {
            "benchmark_id": bench.id,
            "benchmark_hash": bench.content_hash,
            "responses": str(responses_path),
            "resamples": args.resamples,
            "interval": args.interval,
            "level": 0.95,
            "groups": figures,
        }
        json.dump(document, sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
    else:
        print(f"benchmark {bench.id}, responses {responses_path}")
        print(format_table(figures))
    return 0


def add_grade_command(commands: Any) -> None:
    """Add ``vigil grade`` to the CLI's subcommands."""
    parser = commands.add_parser(
        "grade",
        help="grade a file of responses against a benchmark (no services needed)",
        description="Grade a Parquet or JSON Lines file of responses against a benchmark, with "
        "no service running, and print every metric per model and run (and per --group-by axis).",
        epilog="Columns: item_id and raw_text (required); outcome (ok, timeout, transport_error), "
        "model, run, variant, format (mc, open) and phrasing (optional). "
        "Bad input exits with code 2 and one line naming the file, row and field.",
    )
    parser.add_argument("--benchmark", required=True, help="benchmark folder, id or name")
    parser.add_argument("--responses", required=True, help="responses file (.parquet or .jsonl)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--group-by",
        action="append",
        default=[],
        metavar="AXIS",
        help=f"add groups by AXIS (repeatable; 'a,b' crosses two): {', '.join(AXES)}",
    )
    parser.add_argument(
        "--resamples", type=int, default=1000, help="bootstrap resamples (0: no intervals)"
    )
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    parser.add_argument(
        "--interval", choices=("percentile", "bca"), default="percentile", help="interval method"
    )
    parser.add_argument("--root", default=None, help="benchmark root (default: var/benchmarks)")
    parser.set_defaults(handler=cmd_grade)
