"""Validation of manifests and stored benchmarks.

Both entry points return a list of problems (empty when valid) instead of stopping at the first,
so that one run shows everything that needs fixing. Each problem names the item id or the file and
says what is wrong.
"""

from __future__ import annotations

import io
import json
import math
from collections import Counter, defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from benchmark import format as fmt

_META_FIELDS: dict[str, type | tuple[type, ...]] = {
    "format_version": int,
    "name": str,
    "suite": str,
    "size": str,
    "seed": int,
    "content_hash": str,
    "item_count": int,
    "subject_count": int,
    "tasks": dict,
    "created_by": str,
}


def validate_manifest(manifest: pd.DataFrame, images: Mapping[str, bytes] | Path) -> list[str]:
    """Every problem with a manifest and its images.

    ``images`` is either a mapping from relative image path to encoded bytes (a benchmark about to
    be written) or the benchmark folder the paths are relative to.
    """
    problems, _ = _check_manifest(manifest, images)
    return problems


def validate_benchmark(path: str | Path) -> list[str]:
    """Every problem with the benchmark folder at ``path``: its metadata, manifest schema, items,
    images, and whether the recorded content hash and counts match the contents."""
    folder = Path(path)
    if not folder.is_dir():
        return [f"{folder}: not a folder"]
    problems: list[str] = []

    meta = _read_meta(folder, problems)

    manifest_path = folder / fmt.MANIFEST_FILE
    if not manifest_path.is_file():
        problems.append(f"{fmt.MANIFEST_FILE}: missing")
        return problems
    try:
        table = pq.read_table(manifest_path)
    except (OSError, pa.ArrowException) as exc:
        problems.append(f"{fmt.MANIFEST_FILE}: unreadable parquet ({exc})")
        return problems

    version = _format_version(meta, table)
    schema_ok = True
    for field in fmt.schema_for(version):
        if field.name not in table.column_names:
            problems.append(f"{fmt.MANIFEST_FILE}: missing column {field.name!r}")
            schema_ok = False
        elif not table.schema.field(field.name).type.equals(field.type):
            got = table.schema.field(field.name).type
            problems.append(
                f"{fmt.MANIFEST_FILE}: column {field.name!r} has type {got}, expected {field.type}"
            )
            schema_ok = False

    manifest = fmt.fill_defaults(table.to_pandas())
    item_problems, digests = _check_manifest(manifest, folder)
    problems.extend(item_problems)

    if meta is None or not schema_ok:
        return problems
    digest = fmt.content_hash(table.select(list(fmt.columns_for(version))), digests, version)
    if meta.get("content_hash") != digest:
        problems.append(
            f"{fmt.META_FILE}: content_hash {meta.get('content_hash')!r} does not match the "
            f"contents (recomputed {digest})"
        )
    expected_counts = {
        "item_count": len(manifest),
        "subject_count": int(manifest["subject_id"].nunique()),
    }
    for key, value in expected_counts.items():
        if meta.get(key) != value:
            problems.append(f"{fmt.META_FILE}: {key} is {meta.get(key)!r}, manifest has {value}")
    tasks = {str(k): int(v) for k, v in sorted(Counter(manifest["task"]).items())}
    if meta.get("tasks") != tasks:
        problems.append(f"{fmt.META_FILE}: tasks {meta.get('tasks')!r} do not match {tasks!r}")
    name = meta.get("name")
    if isinstance(name, str) and folder.name != fmt.benchmark_id(name, digest):
        problems.append(
            f"{folder.name}: folder name does not match name and hash "
            f"({fmt.benchmark_id(name, digest)})"
        )
    return problems


def _format_version(meta: dict[str, Any] | None, table: pa.Table) -> int:
    """The format version to check a stored manifest against: the one ``benchmark.json`` states
    when it is supported, else the newest whose columns the manifest has."""
    stated = None if meta is None else meta.get("format_version")
    if stated in fmt.SUPPORTED_FORMAT_VERSIONS and not isinstance(stated, bool):
        return int(stated)
    if set(fmt.COLUMNS) <= set(table.column_names):
        return fmt.FORMAT_VERSION
    return 1


def _read_meta(folder: Path, problems: list[str]) -> dict[str, Any] | None:
    meta_path = folder / fmt.META_FILE
    if not meta_path.is_file():
        problems.append(f"{fmt.META_FILE}: missing")
        return None
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        problems.append(f"{fmt.META_FILE}: not valid JSON ({exc})")
        return None
    problems.extend(meta_problems(meta))
    return meta if isinstance(meta, dict) else None


def meta_problems(meta: Any) -> list[str]:
    """Problems with the fields of a parsed ``benchmark.json``."""
    if not isinstance(meta, dict):
        return [f"{fmt.META_FILE}: expected a JSON object"]
    problems = []
    for key, kind in _META_FIELDS.items():
        if key not in meta:
            problems.append(f"{fmt.META_FILE}: missing field {key!r}")
        elif not isinstance(meta[key], kind) or isinstance(meta[key], bool):
            problems.append(f"{fmt.META_FILE}: field {key!r} has the wrong type")
    version = meta.get("format_version")
    if version is not None and (
        isinstance(version, bool) or version not in fmt.SUPPORTED_FORMAT_VERSIONS
    ):
        supported = ", ".join(str(v) for v in fmt.SUPPORTED_FORMAT_VERSIONS)
        problems.append(
            f"{fmt.META_FILE}: format_version {version!r} is not supported (expected one of "
            f"{supported})"
        )
    return problems


# --- manifest checks ------------------------------------------------------------------------


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _as_list(value: Any) -> list[Any] | None:
    if isinstance(value, list | tuple):
        return list(value)
    if isinstance(value, np.ndarray) and value.ndim == 1:
        return value.tolist()
    return None


def _column_type_problems(manifest: pd.DataFrame, present: set[str]) -> tuple[list[str], set[str]]:
    """Type problems, and the columns whose values are safe to use in row checks."""
    problems: list[str] = []
    usable: set[str] = set()
    ids = _item_labels(manifest)
    for name in fmt.STRING_COLUMNS:
        if name not in present:
            continue
        bad = [ids[i] for i, v in enumerate(manifest[name].tolist()) if not _is_str(v)]
        problems.extend(f"item {iid}: column {name!r} must be a string" for iid in bad)
        if not bad:
            usable.add(name)
    for name in fmt.LIST_COLUMNS:
        if name not in present:
            continue
        bad = []
        for i, v in enumerate(manifest[name].tolist()):
            values = _as_list(v)
            if values is None or not all(_is_str(o) for o in values):
                bad.append(ids[i])
        problems.extend(f"item {iid}: column {name!r} must be a list of strings" for iid in bad)
        if not bad:
            usable.add(name)
    for name in fmt.BOOL_COLUMNS:
        if name not in present:
            continue
        series = manifest[name]
        if pd.api.types.is_bool_dtype(series.dtype):
            usable.add(name)
            continue
        bad = [ids[i] for i, v in enumerate(series.tolist()) if not isinstance(v, bool | np.bool_)]
        problems.extend(f"item {iid}: column {name!r} must be a bool" for iid in bad)
        if not bad:
            usable.add(name)
    if "depth" in present:
        dtype = manifest["depth"].dtype
        if pd.api.types.is_float_dtype(dtype) or (
            pd.api.types.is_integer_dtype(dtype) and not pd.api.types.is_bool_dtype(dtype)
        ):
            usable.add("depth")
        else:
            problems.append(f"{fmt.MANIFEST_FILE}: column 'depth' must be float64, got {dtype}")
    if "tumor_voxels" in present:
        dtype = manifest["tumor_voxels"].dtype
        if pd.api.types.is_integer_dtype(dtype) and not pd.api.types.is_bool_dtype(dtype):
            usable.add("tumor_voxels")
        else:
            problems.append(
                f"{fmt.MANIFEST_FILE}: column 'tumor_voxels' must be int64, got {dtype}"
            )
    return problems, usable


def _item_labels(manifest: pd.DataFrame) -> list[str]:
    if "item_id" not in manifest.columns:
        return [f"#{i}" for i in range(len(manifest))]
    return [
        repr(v) if isinstance(v, str) and v else f"#{i}"
        for i, v in enumerate(manifest["item_id"].tolist())
    ]


def _check_manifest(
    manifest: pd.DataFrame, images: Mapping[str, bytes] | Path
) -> tuple[list[str], dict[str, str]]:
    """Problems, and the sha256 of every referenced image that could be read."""
    if not isinstance(manifest, pd.DataFrame):
        return [f"{fmt.MANIFEST_FILE}: expected a pandas DataFrame"], {}
    problems: list[str] = []
    present = set(manifest.columns)
    for name in fmt.COLUMNS:
        if name not in present:
            problems.append(f"{fmt.MANIFEST_FILE}: missing column {name!r}")
    if len(manifest) == 0:
        problems.append(f"{fmt.MANIFEST_FILE}: has no items")
    type_problems, usable = _column_type_problems(manifest, present)
    problems.extend(type_problems)

    ids = _item_labels(manifest)
    if "item_id" in usable:
        for item_id, count in Counter(manifest["item_id"].tolist()).items():
            if count > 1:
                problems.append(f"item {item_id!r}: item_id appears {count} times")
    for name in ("item_id", "subject_id", "prompt", "task", "phrasing"):
        if name in usable:
            for i, v in enumerate(manifest[name].tolist()):
                if not v.strip():
                    problems.append(f"item {ids[i]}: {name} is empty")

    records = manifest.to_dict(orient="records")
    for i, row in enumerate(records):
        problems.extend(_row_problems(ids[i], row, usable))

    uses: dict[str, list[str]] = defaultdict(list)
    if "image_path" in usable:
        for i, path in enumerate(manifest["image_path"].tolist()):
            if path and fmt.path_escape_problem(path) is None:
                uses[path].append(ids[i])
    image_problems, digests = _check_images(uses, images)
    problems.extend(image_problems)
    return problems, digests


def _row_problems(label: str, row: dict[str, Any], usable: set[str]) -> list[str]:
    problems: list[str] = []
    where = f"item {label}"
    abstain = "expect_abstain" in usable and bool(row["expect_abstain"])
    if "format" in usable:
        item_format = row["format"]
        if item_format not in fmt.FORMATS:
            problems.append(
                f"{where}: unknown format {item_format!r} (known: {', '.join(fmt.FORMATS)})"
            )
        elif {"options", "answer"} <= usable:
            problems.extend(_option_problems(where, row, usable, item_format, abstain))
    if "answer" in usable and "expect_abstain" in usable:
        if abstain and row["answer"] != fmt.UNSURE:
            problems.append(
                f"{where}: expect_abstain is set, so answer must be {fmt.UNSURE!r}, "
                f"not {row['answer']!r}"
            )
        elif not abstain and row["answer"] == fmt.UNSURE:
            problems.append(f"{where}: answer is {fmt.UNSURE!r} but expect_abstain is not set")
    if "image_path" in usable:
        path = row["image_path"]
        if path:
            why = fmt.path_escape_problem(path)
            if why is not None:
                problems.append(f"{where}: image_path {path!r} {why}")
            else:
                suffix = Path(path).suffix.lower()
                expected = fmt.MEDIA_TYPES.get(suffix)
                if expected is None:
                    problems.append(f"{where}: image_path {path!r} is not a PNG file")
                elif "media_type" in usable and row["media_type"] != expected:
                    problems.append(
                        f"{where}: media_type {row['media_type']!r} does not match "
                        f"{path!r} (expected {expected!r})"
                    )
        if path and "image_missing" in usable and bool(row["image_missing"]):
            problems.append(
                f"{where}: image_missing is set, so image_path must be '', not {path!r}"
            )
    if "depth" in usable:
        depth = float(row["depth"])
        if not math.isnan(depth) and not 0.0 <= depth <= 1.0:
            problems.append(f"{where}: depth {depth!r} is outside 0..1 (use NaN for none)")
    if "tumor_voxels" in usable and int(row["tumor_voxels"]) < -1:
        problems.append(f"{where}: tumor_voxels {row['tumor_voxels']} is below -1")
    for name, allowed in (
        ("hierarchy", fmt.HIERARCHY),
        ("laterality", fmt.LATERALITIES),
        ("split", fmt.SPLITS),
    ):
        if name in usable and row[name] not in allowed:
            known = ", ".join(repr(v) for v in allowed)
            problems.append(f"{where}: {name} {row[name]!r} is not one of {known}")
    if "supported_findings" in usable:
        findings = _as_list(row["supported_findings"]) or []
        unknown = [f for f in findings if f not in fmt.FINDINGS]
        if unknown:
            problems.append(
                f"{where}: supported_findings {unknown} are not in the findings vocabulary "
                f"({', '.join(fmt.FINDINGS)})"
            )
        repeated = sorted(f for f, n in Counter(findings).items() if n > 1)
        if repeated:
            problems.append(f"{where}: supported_findings repeats {repeated}")
    return problems


def _option_problems(
    where: str, row: dict[str, Any], usable: set[str], item_format: str, abstain: bool
) -> list[str]:
    """Option-set checks: distinct, non-empty options; the answer is one of them (unless the item
    expects UNSURE); mc letters and recorded order match; open items carry no letter or order."""
    problems: list[str] = []
    options = _as_list(row["options"]) or []
    answer = row["answer"]
    if len(options) < 2:
        problems.append(f"{where}: needs at least 2 options, has {len(options)}")
    if item_format == "mc" and len(options) > len(fmt.LETTERS):
        problems.append(f"{where}: has {len(options)} options, at most {len(fmt.LETTERS)}")
    duplicated = sorted(o for o, n in Counter(options).items() if n > 1)
    if duplicated:
        problems.append(f"{where}: duplicated options {duplicated}")
    if any(not o.strip() for o in options):
        problems.append(f"{where}: has an empty option")
    if any(fmt.OPTION_SEPARATOR in o for o in options):
        problems.append(f"{where}: an option contains {fmt.OPTION_SEPARATOR!r}")
    if fmt.UNSURE in options:
        problems.append(f"{where}: {fmt.UNSURE!r} must not be an option (it is always allowed)")
    if item_format == "open":
        if not abstain and answer not in options:
            problems.append(
                f"{where}: answer {answer!r} is not in the task's answer space (options) {options}"
            )
        for name in ("answer_letter", "option_order"):
            if name in usable and row[name] != "":
                problems.append(f"{where}: an open item has no {name}, got {row[name]!r}")
        return problems
    if abstain:
        if "answer_letter" in usable and row["answer_letter"] != "":
            problems.append(
                f"{where}: an item expecting {fmt.UNSURE} has no answer_letter, "
                f"got {row['answer_letter']!r}"
            )
    elif answer not in options:
        problems.append(f"{where}: answer {answer!r} is not one of the options {options}")
    elif "answer_letter" in usable and len(options) <= len(fmt.LETTERS):
        expected = fmt.letter(options.index(answer))
        if row["answer_letter"] != expected:
            problems.append(
                f"{where}: answer_letter {row['answer_letter']!r} does not match the answer's "
                f"position (expected {expected!r})"
            )
    if "option_order" in usable and row["option_order"] != fmt.OPTION_SEPARATOR.join(options):
        problems.append(f"{where}: option_order {row['option_order']!r} does not match options")
    return problems


def _read_image(source: Mapping[str, bytes] | Path, path: str) -> bytes | None:
    if isinstance(source, Path):
        file = source / path
        try:
            return file.read_bytes() if file.is_file() else None
        except OSError:
            return None
    data = source.get(path)
    return data if isinstance(data, bytes | bytearray) else None


def _decode_problem(data: bytes) -> str | None:
    try:
        with Image.open(io.BytesIO(data)) as im:
            im.verify()
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            if im.format != "PNG":
                return f"is {im.format}, not PNG"
    except Exception as exc:  # PIL raises many types for corrupt data
        return f"does not decode ({type(exc).__name__}: {exc})"
    return None


def _check_images(
    uses: Mapping[str, list[str]], source: Mapping[str, bytes] | Path
) -> tuple[list[str], dict[str, str]]:
    problems: list[str] = []
    digests: dict[str, str] = {}
    for path in sorted(uses):
        items = uses[path]
        data = _read_image(source, path)
        if data is None:
            more = f" (and {len(items) - 1} more)" if len(items) > 1 else ""
            problems.append(f"{path}: missing; used by item {items[0]}{more}")
            continue
        data = bytes(data)
        why = _decode_problem(data)
        if why is not None:
            problems.append(f"{path}: {why}")
        name_problem = fmt.expected_image_name_problem(path, data)
        if name_problem is not None:
            problems.append(name_problem)
        digests[path] = fmt.sha256_hex(data)

    if isinstance(source, Path):
        folder = source / fmt.IMAGES_DIR
        stored = (
            {f"{fmt.IMAGES_DIR}/{p.name}" for p in folder.iterdir()} if folder.is_dir() else set()
        )
    else:
        stored = set(source)
    for path in sorted(stored - set(uses)):
        problems.append(f"{path}: not used by any item")
    return problems, digests
