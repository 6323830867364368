"""What every importer shares: reading volumes, cutting and labelling slices, building rows, and
checking an import before it is stored.

Labels are the brain-MRI protocol's own (:mod:`benchmark.suites.labels`): tumour visible with at
least 25 lesion voxels in that exact slice; laterality from the in-slice lesion centroid against the
mid-sagittal line, bilateral with at least 25 lesion voxels on each side of it; the findings the
slice supports. Items are the protocol's too (:mod:`benchmark.suites.items`): each task asked
multiple-choice and open-ended, in the neutral phrasing, options in a seeded order.

Volumes are reoriented to the closest RAS orientation (nibabel's ``as_closest_canonical``), so
array axis 0 runs toward the subject's right, 1 anterior and 2 superior, as in the synthetic
suite; slices are displayed with :func:`benchmark.suites.anatomy.plane_view` (radiological
convention). A slice's depth is the fraction of the volume's foreground extent along the plane's
axis (:func:`foreground_extent`); the mid-sagittal line is the middle of that extent along the
left-right axis.
"""

from __future__ import annotations

import hashlib
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from PIL import Image
from scipy import ndimage

from benchmark import format as fmt
from benchmark.errors import BenchmarkInvalid
from benchmark.prompts import (
    FORMAT_TEMPLATES,
    PREAMBLES,
    QUESTIONS,
    TASK_OPTIONS,
    format_options,
)
from benchmark.suites.anatomy import PLANE_AXIS, PLANES, plane_view
from benchmark.suites.imaging import to_image
from benchmark.suites.items import HIERARCHY_OF, Question, image_items
from benchmark.suites.labels import (
    TUMOR_MIN_VOXELS,
    SliceLabels,
    slice_labels,
    supported_findings,
)
from benchmark.validate import validate_manifest

DEPTHS: tuple[float, ...] = (0.4, 0.5, 0.6)
PHRASING = "neutral"
ITEM_FORMAT = "mc"
IMPORT_FORMATS: tuple[str, ...] = ("mc", "open")
"""Formats every imported slice's tasks are asked in (with the neutral phrasing)."""
FOREGROUND_FRACTION = 0.1
EXTENT_MIN_SHARE = 0.005

SEQUENCES: tuple[str, ...] = ("T1", "T1ce", "T2", "FLAIR", "PD", "MRA", "DWI")
"""Sequence labels an importer may assign ("unknown" where the source does not say)."""

TASK_HIERARCHY: dict[str, str] = {
    **HIERARCHY_OF,
    "modality": "low",
    "view": "low",
    "protocol": "low",
    "organ": "mid",
    "region": "mid",
    "abnormality": "high",
    "diagnosis": "high",
    "severity": "high",
}
"""MedRCube's level of each task Vigil asks: the brain-MRI protocol's tasks (as
:data:`benchmark.suites.items.HIERARCHY_OF` sets them) and the cube's (low: modality, view,
protocol; mid: organ, region; high: abnormality, diagnosis, severity)."""


# --- pure labels ----------------------------------------------------------------------------


def tumor_visible(voxels: int) -> bool:
    """Whether a slice with ``voxels`` lesion voxels counts as tumour-positive."""
    return int(voxels) >= TUMOR_MIN_VOXELS


def lateral_distances(
    shape: tuple[int, ...], plane: str, slice_index: int, midline: float
) -> np.ndarray:
    """Each voxel's signed distance (voxels) from the mid-sagittal line in a slice taken in RAS
    array order (``np.take(volume, slice_index, axis=PLANE_AXIS[plane])``): negative is the
    subject's left. Axis 0 of an axial or coronal slice is the left-right axis; a sagittal slice
    lies at one distance."""
    if plane == "sagittal":
        return np.full(shape, float(slice_index) - midline)
    return np.broadcast_to((np.arange(shape[0], dtype=np.float64) - midline)[:, None], shape)


def volume_slice_labels(
    labels: np.ndarray, plane: str, slice_index: int, midline: float, core_label: int | None = None
) -> SliceLabels:
    """The protocol's labels of one slice of a segmentation (lesion where > 0; ``core_label`` the
    necrotic-core value, if the segmentation has one).

    A sagittal slice exactly on the mid-sagittal line that shows a lesion is "bilateral": the
    lesion crosses the midline there, and the slice has no side of its own.
    """
    labels = np.asarray(labels)
    mask = labels > 0
    lateral = lateral_distances(mask.shape, plane, slice_index, midline)
    core = (labels == core_label).astype(np.float64) if core_label is not None else np.zeros(1)
    result = slice_labels(mask, lateral, np.broadcast_to(core, mask.shape), plane)
    if plane == "sagittal" and float(slice_index) == midline and result.tumor_visible:
        core_voxels = int((mask & (np.broadcast_to(core, mask.shape) >= 0.5)).sum())
        findings = supported_findings(result.tumor_voxels, "bilateral", core_voxels)
        result = SliceLabels(result.tumor_voxels, "bilateral", findings)
    return result


def laterality(mask: np.ndarray, plane: str, slice_index: int, midline: float) -> str:
    """The laterality label of one slice of a lesion mask in RAS array order."""
    return volume_slice_labels(
        np.asarray(mask, dtype=np.int8), plane, slice_index, midline
    ).laterality


def plane_from_orientation(orientation: Sequence[float]) -> str:
    """The acquisition plane from DICOM ImageOrientationPatient (row and column direction
    cosines): the axis the slice normal points along, or "oblique" when no axis dominates
    (no component of the unit normal reaches 0.8)."""
    values = np.asarray([float(v) for v in orientation], dtype=np.float64)
    if values.shape != (6,) or not np.all(np.isfinite(values)):
        raise ValueError(f"ImageOrientationPatient must be 6 numbers, got {list(orientation)!r}")
    normal = np.cross(values[:3], values[3:])
    norm = float(np.linalg.norm(normal))
    if norm < 1e-6:
        raise ValueError("ImageOrientationPatient row and column directions are parallel")
    normal = np.abs(normal / norm)
    axis = int(np.argmax(normal))
    if normal[axis] < 0.8:
        return "oblique"
    return ("sagittal", "coronal", "axial")[axis]


# --- volumes and slices ---------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Volume:
    """A 3-D volume in RAS array order with its voxel sizes (mm)."""

    data: np.ndarray
    zooms: tuple[float, float, float]


def load_nifti(path: Path, problems: list[str], *, integer: bool = False) -> Volume | None:
    """Read a NIfTI volume (reoriented to RAS), or None with the reason added to ``problems``."""
    import nibabel as nib

    if not path.is_file():
        problems.append(f"{path}: missing")
        return None
    try:
        image = nib.as_closest_canonical(nib.load(str(path)))
        data = np.asarray(image.dataobj)
        zooms = tuple(float(z) for z in image.header.get_zooms()[:3])
    except Exception as exc:  # nibabel and zlib raise many kinds for unreadable files
        problems.append(f"{path}: unreadable NIfTI ({type(exc).__name__}: {exc})")
        return None
    if data.ndim == 4 and data.shape[3] == 1:
        data = data[..., 0]
    if data.ndim != 3:
        problems.append(f"{path}: expected a 3-D volume, got shape {tuple(data.shape)}")
        return None
    if min(data.shape) < 2:
        problems.append(f"{path}: volume of shape {tuple(data.shape)} is too thin to slice")
        return None
    if not np.issubdtype(data.dtype, np.number) or np.iscomplexobj(data):
        problems.append(f"{path}: voxel type {data.dtype} is not real-valued")
        return None
    values = data.astype(np.int32 if integer else np.float32)
    if not integer and not np.all(np.isfinite(values)):
        problems.append(f"{path}: holds NaN or infinite values")
        return None
    if len(zooms) != 3 or not all(z > 0 and math.isfinite(z) for z in zooms):
        problems.append(f"{path}: voxel sizes {zooms} are not positive")
        return None
    return Volume(values, (zooms[0], zooms[1], zooms[2]))


def foreground_extent(data: np.ndarray) -> tuple[tuple[int, int], ...]:
    """(first, last) index along each axis of the volume's foreground.

    The foreground is every voxel above the 1st percentile plus 10 % of the 1st-99th percentile
    range; along each axis, the extent runs over the slices holding at least
    :data:`EXTENT_MIN_SHARE` of the fullest slice's foreground voxels, so that isolated noise
    voxels in the background do not stretch it.
    """
    data = np.asarray(data, dtype=np.float32)
    lo, high = (float(v) for v in np.percentile(data, [1, 99]))
    inside = data > lo + FOREGROUND_FRACTION * (high - lo)
    if not inside.any():
        return tuple((0, n - 1) for n in data.shape)
    out = []
    for axis in range(3):
        other = tuple(a for a in range(3) if a != axis)
        counts = inside.sum(axis=other)
        hits = np.nonzero(counts >= max(1.0, EXTENT_MIN_SHARE * float(counts.max())))[0]
        out.append((int(hits[0]), int(hits[-1])))
    return tuple(out)


def depth_index(extent: tuple[int, int], depth: float) -> int:
    """The index at fractional ``depth`` of an (first, last) extent."""
    lo, hi = extent
    return int(np.floor(lo + depth * (hi - lo) + 0.5))


def display_slice(volume: Volume, plane: str, index: int) -> np.ndarray:
    """The display-oriented slice, resampled to square pixels of the volume's finest voxel size."""
    pixels = plane_view(volume.data, plane, index).astype(np.float64)
    axis = PLANE_AXIS[plane]
    o0, o1 = (a for a in range(3) if a != axis)
    finest = min(volume.zooms)
    factors = (volume.zooms[o1] / finest, volume.zooms[o0] / finest)
    if any(abs(f - 1.0) > 1e-3 for f in factors):
        pixels = ndimage.zoom(pixels, factors, order=1, mode="nearest")
    return pixels


def canvas_for(volume: Volume) -> int:
    """The square canvas (in finest-voxel pixels) every plane of ``volume`` is padded to."""
    finest = min(volume.zooms)
    return max(
        int(math.ceil(n * z / finest - 1e-6)) + 1
        for n, z in zip(volume.data.shape, volume.zooms, strict=True)
    )


def stored_image(volume: Volume, plane: str, index: int) -> bytes:
    """The stored PNG of one slice: display orientation, square pixels, percentile-normalised,
    padded to the volume's canvas and resized to the common size."""
    pixels = display_slice(volume, plane, index)
    canvas = max(canvas_for(volume), *pixels.shape)
    return fmt.encode_png(to_image(pixels, canvas=canvas))


@dataclass(frozen=True)
class Cut:
    """Where one slice is cut and what the segmentation says about it."""

    plane: str
    depth: float
    index: int
    tumor_voxels: int  # -1 when the source has no segmentation
    laterality: str  # "" when unknown
    findings: tuple[str, ...] = ()


def cut_labels(
    reference: Volume,
    seg: np.ndarray | None,
    healthy: bool,
    depths: Sequence[float] = DEPTHS,
    core_label: int | None = None,
) -> list[Cut]:
    """Where to cut a subject (every plane x depth) and the labels of each cut.

    ``seg`` is the segmentation on the same grid (lesion where > 0), ``healthy`` says the subject
    has no lesion at all; with neither, tumour labels are unknown.
    """
    extent = foreground_extent(reference.data)
    midline = (extent[0][0] + extent[0][1]) / 2.0
    out = []
    for plane in PLANES:
        axis = PLANE_AXIS[plane]
        for depth in depths:
            index = depth_index(extent[axis], depth)
            if seg is not None:
                labels = volume_slice_labels(
                    np.take(seg, index, axis=axis), plane, index, midline, core_label
                )
                out.append(
                    Cut(
                        plane, depth, index, labels.tumor_voxels, labels.laterality, labels.findings
                    )  # fmt: skip
                )
            elif healthy:
                out.append(Cut(plane, depth, index, 0, "none"))
            else:
                out.append(Cut(plane, depth, index, -1, ""))
    return out


# --- rows -----------------------------------------------------------------------------------


def mc_prompt(question: str, options: Sequence[str]) -> str:
    """A multiple-choice prompt in the prompts module's template and neutral preamble (letter,
    confidence 0-100, UNSURE allowed)."""
    preamble = PREAMBLES.get(PHRASING, "")
    return FORMAT_TEMPLATES[ITEM_FORMAT].format(
        preamble=f"{preamble}\n" if preamble else "",
        question=question,
        options=format_options(options),
    )


def question_of(prompt: str) -> str:
    """The question of a multiple-choice prompt built from the prompts module's template (the
    text between the preamble and the options)."""
    head = prompt.split("\n\nOptions:\n", 1)[0]
    for preamble in sorted(PREAMBLES.values(), key=len, reverse=True):
        if preamble and head.startswith(preamble + "\n"):
            return head[len(preamble) + 1 :]
    return head


def mc_item(
    item_id: str,
    task: str,
    question: str,
    options: Sequence[str],
    answer: str,
    base: Mapping[str, Any],
    phrasing: str = PHRASING,
) -> dict[str, Any]:
    """One multiple-choice row with ``options`` in the order given (already shuffled)."""
    options = list(options)
    return {
        **base,
        "item_id": item_id,
        "task": task,
        "format": ITEM_FORMAT,
        "phrasing": phrasing,
        "prompt": mc_prompt(question, options),
        "options": options,
        "answer": answer,
        "answer_letter": fmt.letter(options.index(answer)) if answer in options else "",
        "option_order": fmt.OPTION_SEPARATOR.join(options),
        "hierarchy": TASK_HIERARCHY.get(task, ""),
    }


def askable(task: str) -> bool:
    """Whether the prompts module can phrase ``task`` (so importers follow the suite's tasks)."""
    return task in TASK_OPTIONS and (task, PHRASING) in QUESTIONS


def brain_slice_rows(
    seed: int,
    variant: str,
    image_path: str,
    cut: Cut,
    sequence: str,
    base: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """The brain-MRI protocol's items about one imported slice, with the answers its labels give:
    sequence (when known), plane, is_brain, and tumour visibility and laterality (when the source
    says where the lesion is)."""
    answers: dict[str, str] = {"plane": cut.plane, "is_brain": "yes"}
    if sequence in SEQUENCES:
        answers["sequence"] = sequence
    if cut.tumor_voxels >= 0:
        answers["tumor_visible"] = "yes" if tumor_visible(cut.tumor_voxels) else "no"
        answers["laterality"] = cut.laterality
    row_base = {
        **base,
        "image_path": image_path,
        "media_type": "image/png",
        "plane": cut.plane,
        "sequence": sequence,
        "depth": float(cut.depth),
        "tumor_voxels": int(cut.tumor_voxels),
        "laterality": cut.laterality,
        "supported_findings": list(cut.findings),
    }
    questions = [
        Question(task, answers[task])
        for task in ("sequence", "plane", "is_brain", "tumor_visible", "laterality")
        if task in answers and askable(task)
    ]
    return image_items(seed, variant, questions, row_base, IMPORT_FORMATS, (PHRASING,))


def control_items(seed: int, variant: str, base: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The items about an imported image that is not a brain MRI: is_brain ("no") and, where the
    protocol has it, the abstention prompt (answer UNSURE)."""
    questions = [Question("is_brain", "no")]
    if askable("abstention"):
        questions.append(Question("abstention", fmt.UNSURE))
    return image_items(seed, variant, questions, base, IMPORT_FORMATS, (PHRASING,))


def variant_name(subject_id: str, sequence: str, cut: Cut) -> str:
    return f"{subject_id}_{sequence}_{cut.plane}_d{round(cut.depth * 100):03d}"


def _default(field: pa.Field) -> Any:
    if field.name in fmt.COLUMN_DEFAULTS:
        value = fmt.COLUMN_DEFAULTS[field.name]
        return list(value) if isinstance(value, tuple) else value
    if pa.types.is_string(field.type):
        return ""
    if pa.types.is_boolean(field.type):
        return False
    if pa.types.is_floating(field.type):
        return float("nan")
    if pa.types.is_integer(field.type):
        return -1
    if pa.types.is_list(field.type):
        return []
    raise TypeError(f"no default for column {field.name} ({field.type})")


def frame_from_rows(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """A manifest DataFrame with every column of the format (missing values take their defaults:
    "" for text, False, NaN depth, -1 tumour voxels, empty lists). Keys that are not columns of the
    format are dropped."""
    defaults = {f.name: _default(f) for f in fmt.MANIFEST_SCHEMA}
    records = []
    for row in rows:
        record = dict(defaults)
        record.update({k: v for k, v in row.items() if k in defaults})
        for name in fmt.COLUMNS:
            if isinstance(record[name], list):
                record[name] = list(record[name])
        records.append(record)
    frame = pd.DataFrame.from_records(records, columns=list(fmt.COLUMNS))
    types: dict[str, Any] = {}
    for f in fmt.MANIFEST_SCHEMA:
        if pa.types.is_boolean(f.type):
            types[f.name] = bool
        elif pa.types.is_floating(f.type):
            types[f.name] = "float64"
        elif pa.types.is_integer(f.type):
            types[f.name] = "int64"
    return frame.astype(types) if len(frame) else frame


# --- checks ---------------------------------------------------------------------------------


def label_problems(manifest: pd.DataFrame) -> list[str]:
    """Problems of label consistency: each answer agrees with the columns it is derived from, and
    the version 2 columns hold known values."""
    problems: list[str] = []
    columns = set(manifest.columns)
    for row in manifest.to_dict(orient="records"):
        where = f"item {row.get('item_id')!r}"
        task, answer = row.get("task"), row.get("answer")
        hierarchy = row.get("hierarchy", "")
        if "hierarchy" in columns and hierarchy not in fmt.HIERARCHY:
            problems.append(f"{where}: unknown hierarchy {hierarchy!r}")
        elif task in TASK_HIERARCHY and hierarchy not in ("", TASK_HIERARCHY[task]):
            problems.append(
                f"{where}: task {task!r} is {TASK_HIERARCHY[task]}-level, not {hierarchy!r}"
            )
        if "split" in columns and row["split"] not in fmt.SPLITS:
            problems.append(f"{where}: unknown split {row['split']!r}")
        if "laterality" in columns and row["laterality"] not in fmt.LATERALITIES:
            problems.append(f"{where}: unknown laterality {row['laterality']!r}")
        if "supported_findings" in columns:
            unknown = [f for f in list(row["supported_findings"]) if f not in fmt.FINDINGS]
            if unknown:
                problems.append(f"{where}: unknown findings {unknown}")
        if "image_missing" in columns and bool(row["image_missing"]) != (row["image_path"] == ""):
            problems.append(
                f"{where}: image_missing is {bool(row['image_missing'])} but image_path is "
                f"{row['image_path']!r}"
            )
        if "expect_abstain" in columns and bool(row["expect_abstain"]) != (answer == fmt.UNSURE):
            problems.append(f"{where}: expect_abstain disagrees with the answer {answer!r}")
        voxels = int(row.get("tumor_voxels", -1))
        if task == "tumor_visible" and voxels >= 0:
            expected = "yes" if tumor_visible(voxels) else "no"
            if answer != expected:
                problems.append(
                    f"{where}: tumor_visible answer {answer!r} but the slice has {voxels} lesion "
                    f"voxels (expected {expected!r})"
                )
        if task == "laterality":
            if answer != row.get("laterality", answer):
                problems.append(
                    f"{where}: laterality answer {answer!r} disagrees with column "
                    f"{row.get('laterality')!r}"
                )
            if voxels >= 0 and (answer == "none") == tumor_visible(voxels):
                problems.append(
                    f"{where}: laterality {answer!r} with {voxels} lesion voxels in the slice"
                )
        if task in ("plane", "sequence") and answer != row.get(task, answer):
            problems.append(
                f"{where}: {task} answer {answer!r} disagrees with column {row.get(task)!r}"
            )
    return problems


def store_import(
    source: Path | str,
    root: Path,
    name: str,
    suite: str,
    rows: list[dict[str, Any]],
    images: dict[str, bytes],
    problems: list[str],
    seed: int = 0,
) -> Any:
    """Check an import (source problems so far, the manifest's schema, images, ids, option sets
    and paths, and label consistency) and store it. Raises BenchmarkInvalid naming every problem;
    then nothing is written."""
    from benchmark.store import write_benchmark

    problems = list(problems)
    if not rows and not problems:
        problems.append(f"{source}: holds nothing to import")
    manifest = frame_from_rows(rows)
    if rows:
        name_problem = fmt.check_name(name)
        if name_problem is not None:
            problems.append(name_problem)
        problems.extend(validate_manifest(manifest, images))
        problems.extend(label_problems(manifest))
    if problems:
        raise BenchmarkInvalid(str(source), _unique(problems))
    return write_benchmark(root, name, suite, "import", seed, manifest, images)


def _unique(problems: list[str]) -> list[str]:
    return list(dict.fromkeys(problems))


def default_name(kind: str, path: Path) -> str:
    """A benchmark name from the importer and the source folder (lowercase, safe characters)."""
    folder = path if path.is_dir() else path.parent
    stem = folder.resolve().name.lower()
    safe = "".join(c if c.isalnum() or c in "._-" else "-" for c in stem).strip("-._")
    name = f"{kind}-{safe}" if safe else kind
    return name[:64].rstrip("-._")


def pseudonym(kind: str, value: str) -> str:
    """A stable pseudonymous id for a patient or series identifier (no patient data stored)."""
    return f"{kind}-{hashlib.sha256(value.encode('utf-8')).hexdigest()[:10]}"


def encode_png_any(image: Image.Image) -> bytes:
    """Encode a decoded image as PNG reproducibly, keeping greyscale as L and colour as RGB
    (RGBA when it has transparency)."""
    if image.mode in ("1", "L", "I;16", "I", "F"):
        if image.mode != "L":
            pixels = np.asarray(image, dtype=np.float64)
            image = Image.fromarray(to_image_bytes(pixels))
    elif image.mode not in ("RGB", "RGBA"):
        has_alpha = "A" in image.mode or "transparency" in image.info
        image = image.convert("RGBA" if has_alpha else "RGB")
    buf = io.BytesIO()
    image.save(buf, format="PNG", compress_level=6, optimize=False)
    return buf.getvalue()


def to_image_bytes(values: np.ndarray) -> np.ndarray:
    """A greyscale array of any range as uint8 (min-max; constant arrays become 0)."""
    lo, hi = float(values.min()), float(values.max())
    if hi <= lo:
        return np.zeros(values.shape, dtype=np.uint8)
    return np.floor((values - lo) / (hi - lo) * 255.0 + 0.5).astype(np.uint8)


@dataclass
class Collected:
    """What an importer gathers: rows, images keyed by path, and the problems it met."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    images: dict[str, bytes] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def add_image(self, png: bytes) -> str:
        path = fmt.image_path_for(png)
        self.images[path] = png
        return path


# --- volume subjects (BraTS, IXI, NIfTI + CSV) ----------------------------------------------


@dataclass(frozen=True)
class SubjectSource:
    """One subject's co-registered volumes and what is known about its lesion."""

    subject_id: str
    # (sequence label, NIfTI file) pairs on one grid; the first is the reference.
    volumes: tuple[tuple[str, Path], ...]
    dataset: str
    seg: Path | None = None  # lesion segmentation on the same grid (lesion where > 0)
    healthy: bool = False  # known to have no lesion at all
    is_brain: bool = True
    modality: str = "MR"
    anatomy: str = "brain"


def import_subject(
    subject: SubjectSource,
    seed: int,
    collected: Collected,
    depths: Sequence[float] = DEPTHS,
    core_label: int | None = None,
) -> None:
    """Read, cut and label one subject into ``collected`` (problems there when it cannot)."""
    try:
        _import_subject(subject, seed, collected, depths, core_label)
    except Exception as exc:  # data no check above foresaw: name it rather than crash
        files = ", ".join(str(path) for _, path in subject.volumes)
        collected.problems.append(f"{files}: cannot be sliced ({type(exc).__name__}: {exc})")


def _import_subject(
    subject: SubjectSource,
    seed: int,
    collected: Collected,
    depths: Sequence[float],
    core_label: int | None,
) -> None:
    problems: list[str] = []
    volumes = [(seq, path, load_nifti(path, problems)) for seq, path in subject.volumes]
    seg = load_nifti(subject.seg, problems, integer=True) if subject.seg is not None else None
    loaded = [(seq, path, v) for seq, path, v in volumes if v is not None]
    if loaded:
        ref_path, reference = loaded[0][1], loaded[0][2]
        for _, path, volume in loaded[1:]:
            if volume.data.shape != reference.data.shape:
                problems.append(
                    f"{path}: shape {volume.data.shape} differs from {ref_path.name} "
                    f"{reference.data.shape}"
                )
        if seg is not None and seg.data.shape != reference.data.shape:
            problems.append(
                f"{subject.seg}: segmentation shape {seg.data.shape} differs from "
                f"{ref_path.name} {reference.data.shape}"
            )
        if seg is not None and int(seg.data.min()) < 0:
            problems.append(f"{subject.seg}: segmentation holds negative labels")
    if problems:
        collected.problems.extend(problems)
        return
    reference = loaded[0][2]
    cuts = cut_labels(
        reference,
        seg.data if seg is not None else None,
        subject.healthy,
        depths,
        core_label,
    )
    base = {
        "subject_id": subject.subject_id,
        "is_control": not subject.is_brain,
        "modality": subject.modality,
        "anatomy": subject.anatomy,
        "dataset": subject.dataset,
    }
    for sequence, _, volume in loaded:
        for cut in cuts:
            image = collected.add_image(stored_image(volume, cut.plane, cut.index))
            variant = variant_name(subject.subject_id, sequence, cut)
            if subject.is_brain:
                collected.rows.extend(brain_slice_rows(seed, variant, image, cut, sequence, base))
            else:
                collected.rows.extend(non_brain_rows(seed, variant, image, cut, sequence, base))


def non_brain_rows(
    seed: int,
    variant: str,
    image_path: str,
    cut: Cut,
    sequence: str,
    base: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """A non-brain volume's slice is a control (see :func:`control_items`)."""
    row_base = {
        **base,
        "image_path": image_path,
        "media_type": "image/png",
        "is_control": True,
        "sequence": sequence,
        "depth": float(cut.depth),
    }
    return control_items(seed, variant, row_base)
