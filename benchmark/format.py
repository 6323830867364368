"""The on-disk benchmark format: manifest schema, image naming and the content hash.

A benchmark is an immutable folder ``ROOT/<name>-<content_hash[:12]>/`` holding

- ``manifest.parquet``: one row per item (one question about one image in one variant), with
  exactly the columns of :data:`MANIFEST_SCHEMA`;
- ``images/``: PNG files named by the first 16 hex digits of the sha256 of their bytes, so that
  identical images are stored once;
- ``benchmark.json``: metadata (:data:`FORMAT_VERSION`, name, suite, size, seed, content hash,
  counts). It is not part of the hash.

Format version 2 added the columns ``hierarchy``, ``laterality``, ``supported_findings``,
``split``, ``image_missing``, ``expect_abstain`` and ``source_json``, and the ``open`` item format. Version 1 folders
stay readable: :func:`fill_defaults` gives their rows the defaults of :data:`COLUMN_DEFAULTS`, and
their content hash is computed over the version 1 columns (:func:`content_hash` with ``version=1``).

The content hash is the sha256 of a canonical serialization (:func:`content_hash`): the manifest
rows sorted by ``item_id`` as JSON lines with sorted keys (floats by ``repr``, NaN as ``null``),
then, for each image path in sorted order, the path and the sha256 of its bytes.

This module is pure: no file I/O, so the store, the validator and the suites share it.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
from PIL import Image

FORMAT_VERSION = 2
SUPPORTED_FORMAT_VERSIONS: tuple[int, ...] = (1, 2)
"""Format versions this code reads; it writes :data:`FORMAT_VERSION`."""
MANIFEST_FILE = "manifest.parquet"
META_FILE = "benchmark.json"
IMAGES_DIR = "images"
TMP_PREFIX = ".tmp-"

MANIFEST_SCHEMA = pa.schema(
    [
        pa.field("item_id", pa.string()),
        pa.field("subject_id", pa.string()),
        pa.field("image_path", pa.string()),
        pa.field("media_type", pa.string()),
        pa.field("task", pa.string()),
        pa.field("format", pa.string()),
        pa.field("phrasing", pa.string()),
        pa.field("prompt", pa.string()),
        pa.field("options", pa.list_(pa.string())),
        pa.field("answer", pa.string()),
        pa.field("answer_letter", pa.string()),
        pa.field("option_order", pa.string()),
        pa.field("is_control", pa.bool_()),
        pa.field("modality", pa.string()),
        pa.field("anatomy", pa.string()),
        pa.field("dataset", pa.string()),
        pa.field("plane", pa.string()),
        pa.field("sequence", pa.string()),
        pa.field("depth", pa.float64()),
        pa.field("tumor_voxels", pa.int64()),
        # Added in format version 2.
        pa.field("hierarchy", pa.string()),
        pa.field("laterality", pa.string()),
        pa.field("supported_findings", pa.list_(pa.string())),
        pa.field("split", pa.string()),
        pa.field("image_missing", pa.bool_()),
        pa.field("expect_abstain", pa.bool_()),
        pa.field("source_json", pa.string()),
    ]
)
"""The manifest columns, in the order they are written, with their exact arrow types."""

COLUMNS: tuple[str, ...] = tuple(MANIFEST_SCHEMA.names)
STRING_COLUMNS: tuple[str, ...] = tuple(
    f.name for f in MANIFEST_SCHEMA if pa.types.is_string(f.type)
)
LIST_COLUMNS: tuple[str, ...] = ("options", "supported_findings")
BOOL_COLUMNS: tuple[str, ...] = ("is_control", "image_missing", "expect_abstain")

V1_COLUMNS: tuple[str, ...] = COLUMNS[: COLUMNS.index("tumor_voxels") + 1]
"""The columns of a format version 1 manifest."""

COLUMN_DEFAULTS: dict[str, Any] = {
    "hierarchy": "",
    "laterality": "",
    "supported_findings": (),
    "split": "audit",
    "image_missing": False,
    "expect_abstain": False,
    "source_json": "",
}
"""Values of the version 2 columns for rows of a version 1 manifest (and for
:func:`fill_defaults`). ``supported_findings`` is an empty list. ``source_json`` keeps an imported
item's source record verbatim (MedRCube), "" for a built item."""

HIERARCHY: tuple[str, ...] = ("low", "mid", "high", "")
"""MedRCube task levels: low (modality, view, protocol), mid (organ, region), high (abnormality,
diagnosis, severity); "" for an item outside the hierarchy (the abstention prompt)."""

LATERALITIES: tuple[str, ...] = ("left", "right", "bilateral", "none", "")
"""Which side of the subject a lesion is on in the item's image ("none": no visible lesion);
"" where laterality does not apply (controls, non-brain images)."""

SPLITS: tuple[str, ...] = ("audit", "train")
"""Subject-level split: the gateway replays "audit" items; a reference model trains on "train"."""

FINDINGS: tuple[str, ...] = (
    "tumor",
    "lesion",
    "edema",
    "enhancement",
    "necrosis",
    "mass_effect",
    "laterality_left",
    "laterality_right",
    "laterality_bilateral",
)
"""Canonical findings an item's label can support. An open-ended answer asserting a finding
outside the item's ``supported_findings`` is a hallucination."""

UNSURE = "UNSURE"
"""The ``answer`` of an item whose right behaviour is to abstain (``expect_abstain``)."""

TASKS: dict[str, str] = {
    "sequence": "MRI sequence (contrast weighting) of the slice",
    "plane": "anatomical plane the slice was cut in",
    "is_brain": "whether the image is a brain MRI",
    "tumor_visible": "whether a tumor is visible in the slice",
    "laterality": "which side of the brain a visible lesion is on",
    "abstention": "a question the image cannot answer; the right reply is UNSURE",
}
"""Known tasks and what each asks. Validation accepts any non-empty task name; this is the list
the prompts and the grader know how to phrase and score."""

FORMATS: dict[str, str] = {
    "mc": "multiple choice: options lettered A, B, C... in presented order",
    "open": "open-ended: options hold the task's answer space (canonical labels), no letters",
}
"""Item formats the validator knows how to check."""

OPTION_SEPARATOR = "|"
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

MEDIA_TYPES: dict[str, str] = {".png": "image/png"}
"""Image file suffix -> media type. Stored images are PNG."""

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
_IMAGE_NAME_RE = re.compile(r"^images/([0-9a-f]{16})\.png$")


def letter(position: int) -> str:
    """The option letter for a zero-based position (0 -> "A")."""
    return LETTERS[position]


def check_name(name: str) -> str | None:
    """Why ``name`` cannot name a benchmark, or None when it can (lowercase, digits, . _ -)."""
    if not _NAME_RE.match(name):
        return (
            f"name {name!r} must be 1-64 characters of lowercase letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return None


def benchmark_id(name: str, digest: str) -> str:
    """The folder name of a benchmark: its name and the first 12 hex digits of its hash."""
    return f"{name}-{digest[:12]}"


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def image_path_for(png: bytes) -> str:
    """The content-addressed path (relative to the benchmark folder) of an encoded image."""
    return f"{IMAGES_DIR}/{sha256_hex(png)[:16]}.png"


def expected_image_name_problem(image_path: str, data: bytes) -> str | None:
    """Why a stored image's name does not match its bytes, or None when it does."""
    m = _IMAGE_NAME_RE.match(image_path)
    if m is None:
        return f"{image_path}: not named images/<16 hex digits of its sha256>.png"
    if sha256_hex(data)[:16] != m.group(1):
        return f"{image_path}: its bytes do not hash to its name (corrupt or altered)"
    return None


def encode_png(pixels: np.ndarray) -> bytes:
    """Encode a 2-D uint8 array as a greyscale PNG, byte-for-byte reproducibly.

    Pillow writes no timestamp or text chunks unless asked; compression level and filter are fixed
    so that the same pixels always give the same bytes with the same Pillow and zlib build.
    """
    if pixels.dtype != np.uint8 or pixels.ndim != 2:
        raise ValueError(f"expected a 2-D uint8 array, got {pixels.dtype} {pixels.shape}")
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels)).save(
        buf, format="PNG", compress_level=6, optimize=False
    )
    return buf.getvalue()


def path_escape_problem(image_path: str) -> str | None:
    """Why ``image_path`` could point outside the benchmark folder, or None when it cannot."""
    if image_path.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", image_path):
        return "is an absolute path"
    parts = re.split(r"[/\\]", image_path)
    if any(part == ".." for part in parts):
        return "contains '..'"
    if "\x00" in image_path:
        return "contains a NUL byte"
    return None


def _canonical_value(value: Any) -> Any:
    if isinstance(value, float | np.floating):
        f = float(value)
        return None if math.isnan(f) else f
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.ndarray):
        return [_canonical_value(v) for v in value.tolist()]
    if isinstance(value, list | tuple):
        return [_canonical_value(v) for v in value]
    return value


def canonical_rows(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """Manifest rows as canonical JSON lines (sorted keys, floats by repr, NaN as null), sorted
    by item_id."""
    lines = []
    for row in rows:
        clean = {k: _canonical_value(v) for k, v in row.items()}
        lines.append(
            (
                str(clean["item_id"]),
                json.dumps(
                    clean,
                    sort_keys=True,
                    separators=(",", ":"),
                    ensure_ascii=False,
                    allow_nan=False,
                ),
            )
        )
    lines.sort(key=lambda pair: pair[0])
    return [line for _, line in lines]


def columns_for(version: int) -> tuple[str, ...]:
    """The manifest columns of a format version."""
    return V1_COLUMNS if version == 1 else COLUMNS


def schema_for(version: int) -> pa.Schema:
    """The manifest schema of a format version."""
    return pa.schema([MANIFEST_SCHEMA.field(name) for name in columns_for(version)])


def fill_defaults(frame: Any) -> Any:
    """Add the version 2 columns a manifest DataFrame lacks, with :data:`COLUMN_DEFAULTS`, in place
    (a version 1 manifest, or a builder that leaves them out); returns the frame."""
    n = len(frame)
    for name, default in COLUMN_DEFAULTS.items():
        if name in frame.columns:
            continue
        if isinstance(default, tuple):
            column = np.empty(n, dtype=object)
            column[:] = [list(default) for _ in range(n)]
        elif isinstance(default, bool):
            column = np.full(n, default, dtype=bool)
        else:
            column = np.full(n, default, dtype=object)
        frame[name] = column
    return frame


def content_hash(
    table: pa.Table, image_digests: Mapping[str, str], version: int = FORMAT_VERSION
) -> str:
    """The content hash of a manifest table (already cast to :data:`MANIFEST_SCHEMA`, or to the
    version 1 schema for ``version=1``) and the sha256 hex digests of its images keyed by relative
    path."""
    h = hashlib.sha256()
    h.update(f"vigil-benchmark-v{version}\n".encode())
    for line in canonical_rows(table.select(list(columns_for(version))).to_pylist()):
        h.update(line.encode("utf-8"))
        h.update(b"\n")
    h.update(b"--images--\n")
    for path in sorted(image_digests):
        h.update(f"{path}\t{image_digests[path]}\n".encode())
    return h.hexdigest()


def manifest_table(manifest: Any) -> pa.Table:
    """A manifest DataFrame as an arrow table with exactly :data:`MANIFEST_SCHEMA` (columns in
    schema order, extra columns dropped, no index). Validate first: bad types raise here."""
    frame = manifest.loc[:, list(COLUMNS)].reset_index(drop=True)
    table = pa.Table.from_pandas(frame, schema=MANIFEST_SCHEMA, preserve_index=False)
    return table.replace_schema_metadata(None)
