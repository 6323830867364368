"""MedRCube's released format: import it into a Vigil benchmark, export a benchmark back to it.

The release is a tree of dataset folders, each with a ``test.json``: a JSON list of items, each
an object with ``id``, ``question``, ``option_A`` .. ``option_D`` (some items have fewer),
``gt_answer`` (the text of the right option), ``image_path`` (relative to that folder),
``task``, ``modality``, ``parts`` and ``dataset``. Some sources ship questions without images.

Import (:func:`collect`): every item becomes one multiple-choice row. Its task is mapped onto
Vigil's task names and MedRCube's hierarchy (:func:`task_key`), its prompt is Vigil's
multiple-choice template around the item's question (letter, confidence 0-100, UNSURE allowed),
and the item itself is kept verbatim in the ``source_json`` column (with the ``test.json`` it came
from and its position there), so that an export gives back the same item. An item whose image is
absent is kept with ``image_missing`` (and no image_path): it is only sent in text-only runs.
Images are stored as PNG: a PNG file's bytes unchanged, any other format decoded and re-encoded.

Export (:func:`export`): items that came from MedRCube are written back verbatim, in their
original files and order; other items are written in MedRCube's fields (the question recovered
from the prompt, options in presented order, task and modality in MedRCube's names), one
``test.json`` per dataset. Images go to each item's ``image_path`` (PNG bytes as stored; another
suffix is re-encoded in that format). JSON is written by :func:`dump_items`, a canonical writer:
a release written with it round-trips through import and export byte for byte.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image, UnidentifiedImageError

from benchmark import format as fmt
from benchmark.errors import BenchmarkInvalid
from benchmark.importers.common import Collected, encode_png_any, mc_prompt, question_of

SOURCE_FORMAT = "medrcube"
TEST_FILE = "test.json"
PHRASING = "medrcube"
SOURCE_COLUMN = "source_json"
TEXT_FIELDS = ("question", "gt_answer", "task", "modality", "parts", "dataset")
_OPTION_RE = re.compile(r"^option_([A-Z])$")

_TASK_WORDS: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (("report",), "report", ""),
    (("view identification",), "view_identification", ""),
    (("modality",), "modality", "low"),
    (("view",), "view", "low"),
    (("protocol", "sequence"), "protocol", "low"),
    (("organ",), "organ", "mid"),
    (("grounding", "region", "roi"), "region", "mid"),
    (("abnorm",), "abnormality", "high"),
    (("severity", "grading"), "severity", "high"),
    (("disease", "diagnos"), "diagnosis", "high"),
)
_TASK_ABBREVIATIONS: dict[str, tuple[str, str]] = {
    "MR": ("modality", "low"),
    "VR": ("view", "low"),
    "IPR": ("protocol", "low"),
    "OR": ("organ", "mid"),
    "RG": ("region", "mid"),
    "AD": ("abnormality", "high"),
    "DD": ("diagnosis", "high"),
    "SG": ("severity", "high"),
}
MODALITY_CODES: dict[str, str] = {
    "CT": "CT",
    "MRI": "MR",
    "MR": "MR",
    "X-RAY": "XR",
    "XRAY": "XR",
    "X RAY": "XR",
    "CXR": "XR",
    "US": "US",
    "ULTRASOUND": "US",
}
"""MedRCube modality names -> the DICOM-style codes Vigil's modality column uses."""
MODALITY_NAMES: dict[str, str] = {"CT": "CT", "MR": "MRI", "XR": "X-Ray", "US": "US"}
"""Vigil modality codes -> MedRCube's names (for exporting items that did not come from it)."""


def task_key(task: str) -> tuple[str, str]:
    """Vigil's task name and MedRCube's level for a MedRCube task name.

    Low: modality, view and protocol recognition; mid: organ recognition and region grounding;
    high: abnormality ("Abnormity Diagnosis"), disease diagnosis and severity grading. "Report
    Generation" and "View Identification" are outside the hierarchy (MedRCube's credibility
    analysis ignores them); an unknown task keeps a slug of its name and no level.
    """
    text = task.strip()
    if text.upper() in _TASK_ABBREVIATIONS:
        return _TASK_ABBREVIATIONS[text.upper()]
    lower = text.lower()
    for words, key, level in _TASK_WORDS:
        if any(w in lower for w in words):
            return key, level
    slug = re.sub(r"[^a-z0-9]+", "_", lower).strip("_")
    return slug or "unknown", ""


def dump_items(items: list[Any]) -> bytes:
    """The canonical ``test.json`` bytes: UTF-8, two-space indent, keys in their given order, a
    final newline."""
    return (json.dumps(items, ensure_ascii=False, indent=2) + "\n").encode("utf-8")


def _envelope(file: str, index: int, item: dict[str, Any]) -> str:
    return json.dumps(
        {"format": SOURCE_FORMAT, "file": file, "index": index, "item": item},
        ensure_ascii=False,
        separators=(",", ":"),
    )


def _options(item: dict[str, Any], where: str, problems: list[str]) -> list[str] | None:
    letters = sorted(m.group(1) for k in item if (m := _OPTION_RE.match(str(k))))
    if len(letters) < 2:
        problems.append(f"{where}: needs at least two options (option_A, option_B, ...)")
        return None
    expected = [fmt.letter(i) for i in range(len(letters))]
    if letters != expected:
        problems.append(f"{where}: options {letters} are not consecutive from option_A")
        return None
    options = [item[f"option_{x}"] for x in letters]
    if not all(isinstance(o, str) for o in options):
        problems.append(f"{where}: every option must be a string")
        return None
    return options


def _image(
    folder: Path, value: str, where: str, problems: list[str], cache: dict[Path, bytes | None]
) -> bytes | None:
    """The PNG bytes to store for an item's image, None when the image is absent."""
    why = fmt.path_escape_problem(value)
    file = (folder / value).resolve()
    if why is None and not file.is_relative_to(folder.resolve()):
        why = "resolves outside its dataset folder"
    if why is not None:
        problems.append(f"{where}: image_path {value!r} {why}")
        return None
    if file in cache:
        return cache[file]
    png: bytes | None = None
    if file.is_dir():
        problems.append(f"{where}: image_path {value!r} is a folder")
    elif file.is_file():
        try:
            data = file.read_bytes()
            with Image.open(io.BytesIO(data)) as im:
                im.load()
                png = data if im.format == "PNG" else encode_png_any(im)
        except (OSError, UnidentifiedImageError, ValueError) as exc:
            problems.append(f"{where}: image {value!r} does not decode ({type(exc).__name__})")
    cache[file] = png
    return png


def _read_test_json(file: Path, problems: list[str]) -> list[Any] | None:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        problems.append(f"{file}: unreadable ({exc})")
        return None
    except json.JSONDecodeError as exc:
        problems.append(f"{file}: bad JSON ({exc})")
        return None
    if not isinstance(data, list):
        problems.append(f"{file}: expected a JSON list of items, got {type(data).__name__}")
        return None
    return data


def collect(path: Path, seed: int = 0) -> Collected:
    """Read a MedRCube release under ``path`` (problems are collected, not raised)."""
    collected = Collected()
    if not path.is_dir():
        collected.problems.append(f"{path}: not a folder")
        return collected
    files = sorted(path.rglob(TEST_FILE), key=lambda p: p.relative_to(path).as_posix())
    if not files:
        collected.problems.append(f"{path}: no {TEST_FILE} in any folder")
        return collected
    cache: dict[Path, bytes | None] = {}
    for file in files:
        items = _read_test_json(file, collected.problems)
        if items is None:
            continue
        rel_file = file.relative_to(path).as_posix()
        rel_folder = file.parent.relative_to(path).as_posix()
        seen: dict[str, int] = {}
        for index, item in enumerate(items):
            try:
                row = _item_row(path, file, rel_file, rel_folder, index, item, seen, collected,
                                cache)  # fmt: skip
            except Exception as exc:  # an item no check foresaw: name it rather than crash
                collected.problems.append(
                    f"{file}: item #{index} cannot be imported ({type(exc).__name__}: {exc})"
                )
                continue
            if row is not None:
                collected.rows.append(row)
    return collected


def _item_row(
    root: Path,
    file: Path,
    rel_file: str,
    rel_folder: str,
    index: int,
    item: Any,
    seen: dict[str, int],
    collected: Collected,
    cache: dict[Path, bytes | None],
) -> dict[str, Any] | None:
    where = f"{file}: item #{index}"
    if not isinstance(item, dict):
        collected.problems.append(f"{where}: expected an object, got {type(item).__name__}")
        return None
    problems: list[str] = []
    item_id = item.get("id")
    if isinstance(item_id, bool) or not isinstance(item_id, str | int) or str(item_id) == "":
        problems.append(f"{where}: missing or empty 'id'")
    else:
        where = f"{file}: item #{index} (id {item_id!r})"
        if str(item_id) in seen:
            problems.append(f"{where}: duplicate id (also item #{seen[str(item_id)]})")
        seen.setdefault(str(item_id), index)
    for key in TEXT_FIELDS:
        if key not in item:
            problems.append(f"{where}: missing field {key!r}")
        elif not isinstance(item[key], str):
            problems.append(f"{where}: field {key!r} must be a string")
    for key in ("question", "gt_answer", "task"):
        if isinstance(item.get(key), str) and not item[key].strip():
            problems.append(f"{where}: field {key!r} is empty")
    image_value = item.get("image_path", "")
    if image_value is None:
        image_value = ""
    if "image_path" not in item:
        problems.append(f"{where}: missing field 'image_path'")
    elif not isinstance(image_value, str):
        problems.append(f"{where}: field 'image_path' must be a string")
        image_value = ""
    options = _options(item, where, problems)
    answer = item.get("gt_answer")
    if options is not None and isinstance(answer, str):
        hits = options.count(answer)
        if hits != 1:
            problems.append(
                f"{where}: gt_answer {answer!r} matches {hits} options (must match exactly one)"
            )
        duplicated = sorted({o for o in options if options.count(o) > 1})
        if duplicated:
            problems.append(f"{where}: duplicated options {duplicated}")
    png = _image(file.parent, image_value, where, problems, cache) if image_value else None
    if problems or options is None:
        collected.problems.extend(problems)
        return None
    task, hierarchy = task_key(item["task"])
    assert isinstance(answer, str)  # checked above
    prefix = "" if rel_folder == "." else f"{rel_folder}/"
    image_path = collected.add_image(png) if png is not None else ""
    return {
        "item_id": f"{prefix}{item_id}",
        "subject_id": f"{prefix}{image_value or item_id}",
        "image_path": image_path,
        "media_type": "image/png" if image_path else "",
        "task": task,
        "format": "mc",
        "phrasing": PHRASING,
        "prompt": mc_prompt(item["question"], options),
        "options": options,
        "answer": answer,
        "answer_letter": fmt.letter(options.index(answer)),
        "option_order": fmt.OPTION_SEPARATOR.join(options),
        "modality": MODALITY_CODES.get(item["modality"].strip().upper(), item["modality"]),
        "anatomy": item["parts"].strip().lower(),
        "dataset": item["dataset"],
        "hierarchy": hierarchy,
        "image_missing": not image_path,
        SOURCE_COLUMN: _envelope(rel_file, index, item),
    }


# --- export ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExportSummary:
    """What an export wrote."""

    out_dir: Path
    files: int
    items: int
    images: int
    skipped: int  # open-ended and abstention items (no option is their answer)


def _dataset_folder(dataset: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", dataset).strip("-.")
    return slug or "dataset"


def _exported_image(data: bytes, suffix: str) -> bytes:
    """Stored PNG bytes in the format an exported path's suffix names."""
    if suffix.lower() == ".png":
        return data
    with Image.open(io.BytesIO(data)) as im:
        im.load()
        out = io.BytesIO()
        image = im.convert("RGB") if suffix.lower() in (".jpg", ".jpeg") else im
        image.save(out, format=Image.registered_extensions().get(suffix.lower(), "PNG"))
        return out.getvalue()


def plan_export(bench: Any) -> tuple[dict[str, list[tuple[int, Any]]], dict[str, bytes], int]:
    """The files of an export (relative path -> (position, item) list), the images (relative path
    -> bytes) and how many items were skipped. Raises BenchmarkInvalid naming every item that
    cannot be exported."""
    manifest = bench.items()
    has_source = SOURCE_COLUMN in manifest.columns
    files: dict[str, list[tuple[int, Any]]] = defaultdict(list)
    images: dict[str, bytes] = {}
    problems: list[str] = []
    skipped = 0
    synthetic: list[tuple[str, dict[str, Any], str]] = []
    for row in manifest.to_dict(orient="records"):
        where = f"item {row['item_id']!r}"
        source = row.get(SOURCE_COLUMN, "") if has_source else ""
        if source:
            try:
                envelope = json.loads(source)
                file, index, item = envelope["file"], int(envelope["index"]), envelope["item"]
                ok = envelope.get("format") == SOURCE_FORMAT and isinstance(item, dict)
            except (ValueError, KeyError, TypeError):
                ok = False
            if not ok or fmt.path_escape_problem(file) is not None:
                problems.append(f"{where}: {SOURCE_COLUMN} is not a MedRCube source record")
                continue
            options = [item[f"option_{fmt.letter(i)}"] for i in range(len(row["options"]))
                       if f"option_{fmt.letter(i)}" in item]  # fmt: skip
            if options != list(row["options"]) or item.get("gt_answer") != row["answer"]:
                problems.append(
                    f"{where}: the source item's options or gt_answer disagree with the manifest"
                )
                continue
            files[file].append((index, item))
            if row["image_path"]:
                folder = Path(file).parent.as_posix()
                target = item["image_path"] if folder == "." else f"{folder}/{item['image_path']}"
                _add_image(bench, images, target, row["image_path"], where, problems)
            continue
        if row["format"] != "mc" or row.get("expect_abstain", False):
            skipped += 1  # open-ended and abstention items have no option that is the answer
            continue
        folder = _dataset_folder(str(row["dataset"]))
        image_rel = ""
        if row["image_path"]:
            image_rel = f"images/{Path(row['image_path']).name}"
            _add_image(bench, images, f"{folder}/{image_rel}", row["image_path"], where, problems)
        item = {
            "id": row["item_id"],
            "question": question_of(row["prompt"]),
            **{f"option_{fmt.letter(i)}": o for i, o in enumerate(row["options"])},
            "gt_answer": row["answer"],
            "image_path": image_rel,
            "task": _medrcube_task(row["task"]),
            "modality": MODALITY_NAMES.get(row["modality"], row["modality"]),
            "parts": str(row["anatomy"]).title(),
            "dataset": row["dataset"],
        }
        synthetic.append((f"{folder}/{TEST_FILE}", item, row["item_id"]))
    if problems:
        raise BenchmarkInvalid(bench.id, problems)
    for file, item, _ in sorted(synthetic, key=lambda t: (t[0], t[2])):
        start = max((i for i, _ in files[file]), default=-1) + 1
        files[file].append((start, item))
    return dict(files), images, skipped


def _medrcube_task(task: str) -> str:
    from benchmark.suites.cube import MEDRCUBE_TASKS

    return MEDRCUBE_TASKS.get(task, task)


def _add_image(
    bench: Any, images: dict[str, bytes], target: str, stored: str, where: str, problems: list[str]
) -> None:
    why = fmt.path_escape_problem(target)
    if why is not None:
        problems.append(f"{where}: export image path {target!r} {why}")
        return
    data = _exported_image(bench.read_image(stored), Path(target).suffix)
    if images.setdefault(target, data) != data:
        problems.append(f"{where}: two different images would be written to {target!r}")


def export(bench: Any, out_dir: Path) -> ExportSummary:
    """Write ``bench`` in MedRCube's format into ``out_dir`` (which must not exist or be empty).

    The tree is written into a temporary folder beside ``out_dir`` and renamed into place, so a
    failed export leaves nothing behind.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise BenchmarkInvalid(str(out_dir), [f"{out_dir}: exists and is not an empty folder"])
    files, images, skipped = plan_export(bench)
    parent = out_dir.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=fmt.TMP_PREFIX, dir=parent))
    try:
        for rel, entries in files.items():
            target = tmp / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(dump_items([item for _, item in sorted(entries, key=_position)]))
        for rel, data in images.items():
            target = tmp / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        os.chmod(tmp, 0o755)
        if out_dir.exists():
            out_dir.rmdir()
        os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    count = sum(len(v) for v in files.values())
    return ExportSummary(out_dir, len(files), count, len(images), skipped)


def _position(entry: tuple[int, Any]) -> int:
    return entry[0]
