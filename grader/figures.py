"""A run's figures: every metric per (task, format) and per grouping axis, with intervals.

Pure: graded rows in, tables out. Each group gets one count table (DESIGN.md, "Measuring well");
the point figures and the subject-clustered bootstrap both come from it.

Groupings: every (task, format) pair with "all" pooling either side; then, over all tasks and
formats, every value of each axis the rows carry (``FIGURE_AXES``: phrasing, plane, sequence,
modality, anatomy, dataset, laterality, hierarchy; an empty value is "not applicable" and forms no
group); then MedRCube's voxels, one per task x modality x anatomy (``group_axis`` "voxel",
``group_value`` "<modality>/<anatomy>", ``task`` the task). A task seen in a single
modality and anatomy has no voxel rows: its task row already is that voxel.

Speed: the count tables of all groups are built in one pass. Rows with identical metric inputs
contribute identical count vectors, so ``build_count_table`` runs once over the distinct input
signatures (one "subject" per signature) and gives a sparse (signature x feature) matrix; each
group's (subject x feature) table is then one sparse product of a (group, subject) x signature
count matrix with it. Point figures for all groups are one batched ``compute_metrics`` call, and
the bootstrap resamples of many groups are stacked into one batch. Every count is an integer held
exactly in float64, so the result equals building each group's table on its own rows (the class
axis is the run's, so a group's table may carry classes absent from it, which count nothing).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import sparse

from grader.bootstrap import percentile_interval, subject_weights
from grader.grading import GROUP_AXES
from grader.metrics import METRIC_NAMES, build_count_table, compute_metrics, reliability_bins
from grader.parsing import Outcome

ALL = "all"
VOXEL = "voxel"
# Axes graded as groupings over all tasks and formats, in output order (deduplicated).
FIGURE_AXES: tuple[str, ...] = tuple(
    dict.fromkeys(("phrasing", *GROUP_AXES, "laterality", "hierarchy"))
)
# Optional graded columns the count table reads when present.
OPTIONAL_METRIC_COLUMNS = ("hallucinated", "expect_abstain", "is_control")
# Bootstrap resamples of this many groups are stacked into one ``compute_metrics`` batch.
_GROUPS_PER_BATCH = 16
# A group table with fewer nonzero counts than this share is resampled as a sparse product.
_SPARSE_BELOW = 0.3


def metric_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The columns the count table reads; classes are namespaced by task so pooling is safe."""
    task = rows["task"].astype(str)
    pred = rows["pred_class"].fillna("").astype(str)
    out = pd.DataFrame(
        {
            "subject_id": rows["subject_id"].astype(str).to_numpy(),
            "outcome": rows["outcome"].to_numpy(),
            "correct": rows["correct"].fillna(False).to_numpy(dtype=bool),
            "confidence": rows["confidence"].to_numpy(dtype=np.int64),
            "true_class": (task + ":" + rows["true_class"].fillna("").astype(str)).to_numpy(),
            "pred_class": np.where(pred != "", task + ":" + pred, ""),
        }
    )
    for column in OPTIONAL_METRIC_COLUMNS:
        if column in rows.columns:
            out[column] = rows[column].to_numpy()
    return out


def group_seed(base: int, run_id: str, *parts: str) -> list[int]:
    """A deterministic bootstrap seed per run and group."""
    return [base, zlib.crc32("|".join((run_id, *parts)).encode())]


@dataclass(frozen=True)
class Group:
    """One cell of the figures: which rows it holds."""

    task: str
    fmt: str
    axis: str
    value: str
    rows: np.ndarray  # row positions, ascending


def _codes(values: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    codes, uniques = pd.factorize(values.fillna("").astype(str), sort=True)
    return np.asarray(codes, dtype=np.int64), np.asarray(uniques, dtype=object)


def _split(codes: np.ndarray, n: int) -> list[np.ndarray]:
    """Row positions of each code 0..n-1 (ascending within a code)."""
    small = codes.astype(np.int16) if n < 2**15 else codes
    order = np.argsort(small, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(n + 1))
    return [order[bounds[i] : bounds[i + 1]] for i in range(n)]


def groups(rows: pd.DataFrame) -> list[Group]:
    """Every group of the figures, in output order (see the module docstring)."""
    everything = np.arange(len(rows))
    tcodes, tasks = _codes(rows["task"])
    fcodes, formats = _codes(rows["format"])
    by_task = _split(tcodes, len(tasks))
    by_format = _split(fcodes, len(formats))
    by_cell = _split(tcodes * len(formats) + fcodes, len(tasks) * len(formats))
    out: list[Group] = []
    for ti, task in enumerate([ALL, *tasks]):
        for fi, fmt in enumerate([ALL, *formats]):
            if ti == 0:
                idx = everything if fi == 0 else by_format[fi - 1]
            else:
                idx = by_task[ti - 1] if fi == 0 else by_cell[(ti - 1) * len(formats) + fi - 1]
            if len(idx):
                out.append(Group(str(task), str(fmt), "", "", idx))
    for axis in FIGURE_AXES:
        if axis not in rows.columns:
            continue
        codes, values = _codes(rows[axis])
        for idx, value in zip(_split(codes, len(values)), values, strict=True):
            if value and len(idx):
                out.append(Group(ALL, ALL, axis, str(value), idx))
    if "modality" in rows.columns and "anatomy" in rows.columns:
        modality = rows["modality"].fillna("").astype(str)
        anatomy = rows["anatomy"].fillna("").astype(str)
        cell = (modality + "/" + anatomy).where((modality != "") & (anatomy != ""), "")
        vcodes, voxels = _codes(cell)
        nv = len(voxels)
        by_voxel = _split(tcodes * nv + vcodes, len(tasks) * nv)
        for ti, task in enumerate(tasks):
            cells = [
                (str(voxels[vi]), by_voxel[ti * nv + vi])
                for vi in range(nv)
                if voxels[vi] and len(by_voxel[ti * nv + vi])
            ]
            if len(cells) >= 2:
                out.extend(Group(str(task), ALL, VOXEL, v, idx) for v, idx in cells)
    return out


def _signatures(metric_rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(signature of each row, position of each signature's first row), in first-seen order."""
    key = np.zeros(len(metric_rows), dtype=np.int64)
    for column in metric_rows.columns:
        if column == "subject_id":
            continue
        codes, uniques = pd.factorize(metric_rows[column], use_na_sentinel=False)
        key = key * max(len(uniques), 1) + codes
        key, _ = pd.factorize(key)  # keeps the key small: no overflow whatever the columns
    signature, uniques = pd.factorize(key)
    first = np.full(len(uniques), len(signature), dtype=np.int64)
    np.minimum.at(first, signature, np.arange(len(signature)))
    return np.asarray(signature, dtype=np.int64), first


@dataclass
class GroupTables:
    """Every group's count table, built in one pass."""

    groups: list[Group]
    tables: list[np.ndarray]  # per group: (subjects in the group, F), subjects sorted by id
    layout: object  # grader.metrics.Layout shared by all tables
    response_counts: np.ndarray  # (G,)
    subject_counts: np.ndarray  # (G,)


def group_tables(rows: pd.DataFrame, group_list: Sequence[Group] | None = None) -> GroupTables:
    """Count tables of every group of ``rows`` (``groups(rows)`` unless given)."""
    group_list = list(groups(rows) if group_list is None else group_list)
    inputs = metric_rows(rows)
    signature, first = _signatures(inputs)
    sig_rows = inputs.iloc[first].copy()
    sig_rows["subject_id"] = [f"{i:010d}" for i in range(len(first))]
    per_signature = build_count_table(sig_rows)  # row u is signature u's count vector
    phi = sparse.csr_matrix(per_signature.counts)
    scodes, _ = _codes(inputs["subject_id"])
    n_subjects = int(scodes.max()) + 1 if len(scodes) else 0
    sizes = np.array([len(g.rows) for g in group_list], dtype=np.int64)
    member = np.concatenate([g.rows for g in group_list]) if group_list else np.zeros(0, np.int64)
    gid = np.repeat(np.arange(len(group_list), dtype=np.int64), sizes)
    pair = gid * n_subjects + scodes[member]
    counts = sparse.csr_matrix(
        (np.ones(len(member)), (pair, signature[member])),
        shape=(len(group_list) * n_subjects, len(first)),
    )
    present = np.diff(counts.indptr).reshape(len(group_list), n_subjects) > 0
    product = (counts @ phi).tocsr()
    tables = []
    for g in range(len(group_list)):
        block = product[g * n_subjects : (g + 1) * n_subjects].toarray()
        tables.append(block[present[g]])
    return GroupTables(
        groups=group_list,
        tables=tables,
        layout=per_signature.layout,
        response_counts=sizes,
        subject_counts=present.sum(axis=1),
    )


def resampled_batch(
    tables: Sequence[np.ndarray], seeds: Sequence[Sequence[int]], n_resamples: int, layout: object
) -> list[dict[str, np.ndarray]]:
    """Each table's metrics over ``n_resamples`` subject-clustered resamples, in one batch.

    Table i is resampled with ``numpy.random.default_rng(seeds[i])`` exactly as
    ``grader.bootstrap.resampled_metrics`` does; only the metric computation is batched.
    """
    if not tables:
        return []
    n_features = tables[0].shape[1]
    # Filled feature by feature: compute_metrics reads blocks of features, and reads them
    # faster from a column-major batch.
    stacked_t = np.zeros((n_features, len(tables) * n_resamples))
    for i, (table, seed) in enumerate(zip(tables, seeds, strict=True)):
        weights = subject_weights(table.shape[0], n_resamples, np.random.default_rng(seed))
        used = np.flatnonzero(table.any(axis=0))
        part_t = np.ascontiguousarray(table[:, used].T)
        # Every product here sums integer counts, so each route gives the same exact numbers.
        if np.count_nonzero(part_t) < _SPARSE_BELOW * part_t.size:
            # A small group (a voxel, a dataset): few counts per subject, a sparse product.
            sums_t = sparse.csr_matrix(part_t) @ np.ascontiguousarray(weights.T)
        elif weights.max(initial=0.0) * part_t.sum(axis=1).max(initial=0.0) < 2**24:
            # float32 is exact while every sum stays below 2**24, and twice as fast.
            sums_t = part_t.astype(np.float32) @ weights.T.astype(np.float32)
        else:
            sums_t = part_t @ weights.T
        stacked_t[used, i * n_resamples : (i + 1) * n_resamples] = sums_t
    stacked = stacked_t.T
    values = compute_metrics(stacked, layout)  # type: ignore[arg-type]
    return [
        {name: np.asarray(v)[i * n_resamples : (i + 1) * n_resamples] for name, v in values.items()}
        for i in range(len(tables))
    ]


def percentile_intervals(resampled: dict[str, np.ndarray]) -> dict[str, tuple[float, float]]:
    """``grader.bootstrap.percentile_interval`` (95%) of every metric, vectorised over the
    metrics whose resampled values are all finite (``numpy.percentile`` along an axis gives the
    same numbers as on each row); the others go through ``percentile_interval`` itself."""
    names = [n for n in METRIC_NAMES if n in resampled]
    values = np.stack([np.asarray(resampled[n], dtype=np.float64) for n in names])
    finite: np.ndarray = np.asarray(~np.isnan(values).any(axis=1), dtype=bool)
    out: dict[str, tuple[float, float]] = {}
    if finite.any():
        lower, upper = np.percentile(values[finite], [2.5, 97.5], axis=1)
        for name, lo, hi in zip(np.asarray(names)[finite], lower, upper, strict=True):
            out[str(name)] = (float(lo), float(hi))
    for name, ok in zip(names, [bool(f) for f in finite], strict=True):
        if not ok:
            out[name] = percentile_interval(resampled[name])
    return {n: out[n] for n in names}


def compute_run_figures(
    rows: pd.DataFrame,
    run_id: str,
    model_name: str,
    *,
    final: bool,
    n_resamples: int,
    seed: int,
    min_subjects: int,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(metrics, reliability bins) for one run's graded rows."""
    rows = rows[rows["outcome"] != "ungraded"].reset_index(drop=True)
    metric_out: list[dict[str, object]] = []
    bin_out: list[dict[str, object]] = []
    if rows.empty:
        return pd.DataFrame(metric_out), pd.DataFrame(bin_out)
    built = group_tables(rows)
    totals = np.stack([t.sum(axis=0) for t in built.tables])
    point = {k: np.asarray(v) for k, v in compute_metrics(totals, built.layout).items()}  # type: ignore[arg-type]
    too_few = built.subject_counts < min_subjects
    boot = [g for g in range(len(built.groups)) if final and n_resamples > 0 and not too_few[g]]
    intervals: dict[int, dict[str, tuple[float, float]]] = {}
    for start in range(0, len(boot), _GROUPS_PER_BATCH):
        chunk = boot[start : start + _GROUPS_PER_BATCH]
        seeds = [
            group_seed(seed, run_id, gr.task, gr.fmt, gr.axis, gr.value)
            for gr in (built.groups[g] for g in chunk)
        ]
        resampled = resampled_batch(
            [built.tables[g] for g in chunk], seeds, n_resamples, built.layout
        )
        for g, values in zip(chunk, resampled, strict=True):
            intervals[g] = percentile_intervals(values)
    nan = (float("nan"), float("nan"))
    for g, group in enumerate(built.groups):
        mine = intervals.get(g, {})
        for metric in point:
            val = float(point[metric][g])
            lo, hi = mine.get(metric, nan)
            has = bool(np.isfinite(lo) and np.isfinite(hi))
            metric_out.append(
                {
                    "run_id": run_id,
                    "model_name": model_name,
                    "task": group.task,
                    "format": group.fmt,
                    "group_axis": group.axis,
                    "group_value": group.value,
                    "metric": metric,
                    "value": val,
                    "has_interval": has,
                    "lower": float(lo) if has else None,
                    "upper": float(hi) if has else None,
                    "response_count": int(built.response_counts[g]),
                    "subject_count": int(built.subject_counts[g]),
                    "too_few_subjects": bool(too_few[g]),
                    "final": final,
                }
            )
        if not group.axis:
            for i, (lo_pct, hi_pct, count, mean_conf, acc) in enumerate(
                reliability_bins(totals[g], built.layout)  # type: ignore[arg-type]
            ):
                bin_out.append(
                    {
                        "run_id": run_id,
                        "task": group.task,
                        "format": group.fmt,
                        "bin": i,
                        "lower_percent": int(lo_pct),
                        "upper_percent": int(hi_pct),
                        "count": int(count),
                        "mean_confidence": None if not np.isfinite(mean_conf) else float(mean_conf),
                        "accuracy": None if not np.isfinite(acc) else float(acc),
                    }
                )
    return pd.DataFrame(metric_out), pd.DataFrame(bin_out)


def run_alerts(
    rows: pd.DataFrame, run: dict[str, object], transport_error_alert_rate: float
) -> list[dict[str, object]]:
    """Alerts a finished run raises: a failed run, and too many transport errors."""
    alerts: list[dict[str, object]] = []
    run_id, model = str(run["run_id"]), str(run["model_name"])
    when = run.get("end_time") or run.get("start_time")
    if run.get("state") == "failed":
        alerts.append(
            {
                "alert_id": f"{run_id}:run_failed",
                "kind": "run_failed",
                "severity": "critical",
                "model_name": model,
                "run_id": run_id,
                "message": f"Run {run_id} of {model} failed before every item was answered.",
                "create_time": when,
            }
        )
    if len(rows):
        rate = float((rows["outcome"] == Outcome.TRANSPORT_ERROR.value).mean())
        if rate > transport_error_alert_rate:
            alerts.append(
                {
                    "alert_id": f"{run_id}:transport_errors",
                    "kind": "transport_errors",
                    "severity": "warning",
                    "model_name": model,
                    "run_id": run_id,
                    "message": (
                        f"{rate:.1%} of {model}'s requests in run {run_id} failed in transport"
                        f" or timed out (threshold {transport_error_alert_rate:.0%})."
                    ),
                    "create_time": when,
                }
            )
    return alerts
