"""The ``cube`` suite: MedRCube's task x modality x anatomy cube, built offline.

Images come from two sources:

- slices of synthetic brain-MRI subjects (the ``brain-mri`` suite's MNI152 subjects and renderer),
  healthy or with a tumour of a chosen size class, in every generated sequence and three planes;
- the non-brain DICOM samples pydicom ships (a chest CT, an abdominal MR, three ultrasound
  studies; see :mod:`benchmark.suites.controls`), with their modality, plane and body region read
  from their metadata.

Every image carries a chain of items on the SAME image, four options each, so that the credibility
analysis (pairs of a high-level and a low-level item per image) has pairs to count:

====================  ======  ===========================================================
task                  level   label
====================  ======  ===========================================================
``modality``          low     the source's modality (DICOM Modality, MR for the synthetic)
``view``              low     the plane the slice was cut in / ImageOrientationPatient
``protocol``          low     the sequence the slice was rendered with (MR brain only)
``organ``             mid     the body region (brain; the DICOM file's region)
``region``            mid     what the red box drawn on the image mainly contains (tumour,
                              CSF, white or grey matter; recomputed from the tissue maps)
``abnormality``       high    mass lesion when the slice holds >= 25 lesion voxels
``diagnosis``         high    glioma when the slice holds >= 25 lesion voxels, else normal
``severity``          high    lesion size from the in-slice area: equivalent diameter < 20 mm
                              small, 20-40 mm medium, >= 40 mm large; "no lesion" otherwise
====================  ======  ===========================================================

Brain slices holding 1-24 lesion voxels are left out (neither clearly normal nor abnormal). The
DICOM images get the low- and mid-level items their metadata supports (no lesion labels exist
for them). Every prompt asks for a letter, a confidence 0-100, and allows UNSURE.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from PIL import Image
from scipy import ndimage
from tqdm import tqdm

from benchmark.importers.common import (
    TASK_HIERARCHY,
    Collected,
    encode_png_any,
    frame_from_rows,
    mc_item,
    plane_from_orientation,
)
from benchmark.suites import anatomy
from benchmark.suites.controls import DICOM_SOURCES, _dicom_variant, load_dicom_source
from benchmark.suites.imaging import normalise, pad_square, resize
from benchmark.suites.items import option_order
from benchmark.suites.labels import TUMOR_MIN_VOXELS

SUITE = "cube"
PHRASING = "cube"
BRAIN_DATASET = "cube-synthetic-brain"
DICOM_DATASET = "pydicom-samples"
OPTION_COUNT = 4
BOX_COLOUR = (255, 0, 0)

QUESTIONS: dict[str, str] = {
    "modality": "Which imaging modality produced this image?",
    "view": "In which plane or view was this image acquired?",
    "protocol": "Which MRI sequence (imaging protocol) produced this image?",
    "organ": "Which organ or body region is the main subject of this image?",
    "region": "What does the area inside the red box mainly contain?",
    "abnormality": "Which abnormality, if any, does this image show?",
    "diagnosis": "What is the most likely diagnosis for this image?",
    "severity": "How large is the lesion shown in this image?",
}
"""The question of each cube task (Vigil's wording)."""

MEDRCUBE_TASKS: dict[str, str] = {
    "modality": "Modality Recognition",
    "view": "View Recognition",
    "protocol": "Imaging Protocol Recognition",
    "organ": "Organ Recognition",
    "region": "Region of Interest Grounding",
    "abnormality": "Abnormity Diagnosis",
    "diagnosis": "Disease Diagnosis",
    "severity": "Severity Grading",
}
"""Each cube task's name in MedRCube's released format (as its credibility script spells them)."""

MODALITY_NAMES: dict[str, str] = {
    "CT": "CT",
    "MR": "MRI",
    "CR": "X-ray",
    "DX": "X-ray",
    "XR": "X-ray",
    "US": "ultrasound",
}
ANSWER_SPACES: dict[str, tuple[str, ...]] = {
    "modality": ("CT", "MRI", "X-ray", "ultrasound"),
    "view": ("axial", "coronal", "sagittal", "oblique"),
    "protocol": ("T1", "T1ce", "T2", "FLAIR", "PD", "DWI"),
    "organ": ("brain", "lungs", "heart", "abdomen", "fetus", "lymph node", "breast"),
    "region": ("tumor", "cerebrospinal fluid", "white matter", "grey matter"),
    "abnormality": ("no abnormality", "mass lesion", "haemorrhage", "infarct"),
    "diagnosis": ("normal brain", "glioma", "multiple sclerosis", "ischaemic stroke"),
    "severity": ("no lesion", "small (under 2 cm)", "medium (2 to 4 cm)", "large (over 4 cm)"),
}
"""The answer space of each task; items with more than four draw three distractors per item."""

ORGAN_OF_ANATOMY: dict[str, str] = {
    "brain": "brain",
    "chest": "lungs",
    "heart": "heart",
    "abdomen": "abdomen",
    "obstetric": "fetus",
    "lymph node": "lymph node",
}
REGION_CLASSES: tuple[str, ...] = ("tumor", "csf", "wm", "gm")
REGION_NAMES: dict[str, str] = dict(zip(REGION_CLASSES, ANSWER_SPACES["region"], strict=True))
BOX_MM = 10
"""Side of a tissue box on the subject grid (mm); a lesion box is the lesion's bounding box."""
BOX_MIN_SHARE = 0.6
"""A box must hold at least this share of its class (its label is then unambiguous)."""
SEVERITY_EDGES_MM = (20.0, 40.0)


@dataclass(frozen=True)
class SizeSpec:
    subjects: int
    tumor_subjects: int
    depths: tuple[float, ...]
    sequences_per_subject: int
    dicom_variants: tuple[str, ...]
    lesion_band: tuple[tuple[float, float], tuple[float, float]]


SIZES: dict[str, SizeSpec] = {
    "small": SizeSpec(6, 4, (0.5,), 2, ("original",), ((0.42, 0.58), (0.42, 0.58))),
    "paper": SizeSpec(
        48,
        32,
        (0.4, 0.5, 0.6),
        2,
        ("original", "mirrored", "cropped", "rotated"),
        ((0.38, 0.62), (0.4, 0.62)),
    ),
}
_SIDES = ("left", "right", "midline")
_CLASSES = ("small", "medium", "large")


def sequences() -> tuple[str, ...]:
    """The protocols the renderer can make, in the answer space's order."""
    return tuple(s for s in ANSWER_SPACES["protocol"] if s in anatomy.GENERATED_SEQUENCES)


# --- labels (pure) --------------------------------------------------------------------------


def severity_label(tumor_voxels: int) -> str:
    """Lesion size class from the in-slice lesion area (voxels of 1 mm^2)."""
    if tumor_voxels < TUMOR_MIN_VOXELS:
        return ANSWER_SPACES["severity"][0]
    diameter = 2.0 * np.sqrt(tumor_voxels / np.pi)
    small, large = SEVERITY_EDGES_MM
    if diameter < small:
        return ANSWER_SPACES["severity"][1]
    if diameter < large:
        return ANSWER_SPACES["severity"][2]
    return ANSWER_SPACES["severity"][3]


def class_shares(fields: anatomy.Fields) -> dict[str, np.ndarray]:
    """Per-pixel share of each region class: the lesion, and CSF / WM / GM outside it."""
    lesion = fields.lesion.astype(np.float64)
    healthy = 1.0 - lesion
    return {
        "tumor": lesion,
        "csf": np.asarray(fields.csf, dtype=np.float64) * healthy,
        "wm": np.asarray(fields.wm, dtype=np.float64) * healthy,
        "gm": np.asarray(fields.gm, dtype=np.float64) * healthy,
    }


def box_label(fields: anatomy.Fields, box: tuple[int, int, int, int]) -> tuple[str, float]:
    """The class that fills most of a box (rows r0:r1, columns c0:c1 of the field grid) and its
    mean share."""
    r0, r1, c0, c1 = box
    shares = {k: float(v[r0:r1, c0:c1].mean()) for k, v in class_shares(fields).items()}
    best = max(REGION_CLASSES, key=lambda k: shares[k])
    return best, shares[best]


def choose_box(
    fields: anatomy.Fields, rng: np.random.Generator
) -> tuple[str, tuple[int, int, int, int]] | None:
    """A box to draw and the class it holds: the lesion's bounding box for half the slices that
    show one, otherwise a BOX_MM square dominated by CSF, WM or GM (class drawn at random)."""
    shares = class_shares(fields)
    options: list[tuple[str, tuple[int, int, int, int]]] = []
    lesion = fields.lesion
    if int(lesion.sum()) >= TUMOR_MIN_VOXELS:
        rows, cols = np.nonzero(lesion)
        box = (int(rows.min()), int(rows.max()) + 1, int(cols.min()), int(cols.max()) + 1)
        if box_label(fields, box)[0] == "tumor":
            options.append(("tumor", box))
    h, w = lesion.shape
    half = BOX_MM // 2
    for name in ("csf", "wm", "gm"):
        mean = ndimage.uniform_filter(shares[name], size=BOX_MM, mode="constant")
        candidates = np.argwhere(mean >= BOX_MIN_SHARE + 0.05)
        candidates = candidates[
            (candidates[:, 0] >= half)
            & (candidates[:, 0] <= h - half)
            & (candidates[:, 1] >= half)
            & (candidates[:, 1] <= w - half)
        ]
        for _ in range(min(8, len(candidates))):
            r, c = candidates[int(rng.integers(len(candidates)))]
            box = (int(r) - half, int(r) - half + BOX_MM, int(c) - half, int(c) - half + BOX_MM)
            label, share = box_label(fields, box)
            if label == name and share >= BOX_MIN_SHARE:
                options.append((name, box))
                break
    if not options:
        return None
    if options[0][0] == "tumor" and (len(options) == 1 or rng.random() < 0.5):
        return options[0]  # half the lesion slices box the lesion, so "tumor" is a common answer
    tissues = [o for o in options if o[0] != "tumor"]
    return tissues[int(rng.integers(len(tissues)))]


def draw_box(grey: np.ndarray, box: tuple[int, int, int, int], field_shape: tuple[int, int],
             canvas: int) -> np.ndarray:  # fmt: skip
    """The stored RGB image: ``grey`` (IMAGE_SIZE square) with a red box around ``box`` (field
    grid coordinates, mapped through the same padding and resize as the image)."""
    h, w = field_shape
    top, left = (canvas - h) // 2, (canvas - w) // 2
    scale = grey.shape[0] / canvas
    r0, r1, c0, c1 = box
    y0 = int(np.floor((r0 + top) * scale)) - 1
    y1 = int(np.ceil((r1 + top) * scale))
    x0 = int(np.floor((c0 + left) * scale)) - 1
    x1 = int(np.ceil((c1 + left) * scale))
    n = grey.shape[0] - 1
    y0, y1, x0, x1 = (int(np.clip(v, 0, n)) for v in (y0, y1, x0, x1))
    rgb = np.repeat(grey[:, :, None], 3, axis=2)
    colour = np.array(BOX_COLOUR, dtype=np.uint8)
    rgb[y0, x0 : x1 + 1] = colour
    rgb[y1, x0 : x1 + 1] = colour
    rgb[y0 : y1 + 1, x0] = colour
    rgb[y0 : y1 + 1, x1] = colour
    return rgb


# --- items ----------------------------------------------------------------------------------


def _rng(seed: int, *key: str) -> np.random.Generator:
    digest = hashlib.sha256("\x00".join(key).encode()).digest()[:8]
    return np.random.default_rng([seed, 6, int.from_bytes(digest, "big")])


def cube_item(
    seed: int, item_id: str, task: str, answer: str, base: Mapping[str, Any]
) -> dict[str, Any]:
    """One four-option item of a cube task: the answer plus three distractors drawn from the
    task's answer space (per item), in a seeded order."""
    space = ANSWER_SPACES[task]
    if answer not in space:
        raise ValueError(f"{answer!r} is not in the answer space of {task}")
    others = [o for o in space if o != answer]
    if len(others) > OPTION_COUNT - 1:
        picked = _rng(seed, item_id, "distractors").choice(len(others), OPTION_COUNT - 1, False)
        others = [others[i] for i in sorted(picked.tolist())]
    options = option_order(seed, item_id, [answer, *others])
    row = mc_item(item_id, task, QUESTIONS[task], options, answer, base, phrasing=PHRASING)
    row["hierarchy"] = TASK_HIERARCHY[task]
    return row


def modality_item(
    seed: int, item_id: str, modality_code: str, base: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The modality question for an image of a DICOM modality code (None for codes outside the
    cube's answer space)."""
    name = MODALITY_NAMES.get(modality_code.upper())
    return None if name is None else cube_item(seed, item_id, "modality", name, base)


@dataclass(frozen=True)
class SubjectPlan:
    index: int
    sequences: tuple[str, ...]
    side: str | None
    size_class: str


def plan_subjects(size: str, seed: int) -> tuple[SubjectPlan, ...]:
    spec = SIZES[size]
    pool = sequences()
    rng = np.random.default_rng([seed, 7])
    tumor = set(rng.permutation(spec.subjects)[: spec.tumor_subjects].tolist())
    plans, rank = [], 0
    for index in range(spec.subjects):
        start = (index * spec.sequences_per_subject) % len(pool)
        seqs = tuple(pool[(start + k) % len(pool)] for k in range(spec.sequences_per_subject))
        side = None
        size_class = _CLASSES[index % len(_CLASSES)]
        if index in tumor:
            side, size_class = _SIDES[rank % len(_SIDES)], _CLASSES[rank % len(_CLASSES)]
            rank += 1
        plans.append(SubjectPlan(index, tuple(sorted(seqs, key=pool.index)), side, size_class))
    return tuple(plans)


def _brain_images(size: str, seed: int, plan: SubjectPlan, collected: Collected) -> None:
    from benchmark.suites.brain_mri import slice_pixels

    spec = SIZES[size]
    subject = anatomy.make_subject(
        seed,
        plan.index,
        sequences=plan.sequences,
        lesion_side=plan.side,
        lesion_class=plan.size_class,
        lesion_band=spec.lesion_band,
    )
    subject_id = f"cube-{subject.subject_id}"
    canvas = max(anatomy.load_atlas().grid_shape)
    for plane in anatomy.PLANES:
        for depth in spec.depths:
            sample = anatomy.extract_slice(subject, plane, depth)
            voxels = sample.tumor_voxels
            if 0 < voxels < TUMOR_MIN_VOXELS:
                continue  # neither clearly normal nor abnormal
            visible = voxels >= TUMOR_MIN_VOXELS
            for sequence in subject.sequences:
                variant = f"{subject_id}_{sequence}_{plane}_d{round(depth * 100):03d}"
                chosen = choose_box(sample.fields, _rng(seed, variant, "box"))
                grey = slice_pixels(sample, sequence)
                if chosen is None:
                    continue
                region, box = chosen
                rgb = draw_box(grey, box, sample.fields.lesion.shape, canvas)
                path = collected.add_image(encode_png_any(Image.fromarray(rgb, mode="RGB")))
                base = {
                    "subject_id": subject_id,
                    "image_path": path,
                    "media_type": "image/png",
                    "modality": "MR",
                    "anatomy": "brain",
                    "dataset": BRAIN_DATASET,
                    "plane": plane,
                    "sequence": sequence,
                    "depth": float(depth),
                    "tumor_voxels": int(voxels),
                    "supported_findings": ["tumor", "lesion"] if visible else [],
                }
                answers = {
                    "modality": "MRI",
                    "view": plane,
                    "protocol": sequence,
                    "organ": "brain",
                    "region": REGION_NAMES[region],
                    "abnormality": "mass lesion" if visible else "no abnormality",
                    "diagnosis": "glioma" if visible else "normal brain",
                    "severity": severity_label(voxels),
                }
                for task, answer in answers.items():
                    item_id = f"{variant}_{task}_mc_{PHRASING}"
                    collected.rows.append(cube_item(seed, item_id, task, answer, base))


def _dicom_images(size: str, seed: int, collected: Collected) -> None:
    import pydicom
    from pydicom.data import get_testdata_file

    k = 0
    for variant in SIZES[size].dicom_variants:
        for source in DICOM_SOURCES:
            k += 1
            values = _dicom_variant(load_dicom_source(source), variant)
            png = encode_png_any(Image.fromarray(resize(pad_square(normalise(values)))))
            path = collected.add_image(png)
            ds = pydicom.dcmread(str(get_testdata_file(source.filename)), stop_before_pixels=True)
            orientation = ds.get("ImageOrientationPatient", None)
            plane = plane_from_orientation(list(orientation)) if orientation is not None else ""
            # Mirroring, cropping and rotating within the image keep the acquisition plane.
            subject_id = f"cube-dicom-{k:03d}"
            base = {
                "subject_id": subject_id,
                "image_path": path,
                "media_type": "image/png",
                "modality": source.modality,
                "anatomy": source.anatomy,
                "dataset": DICOM_DATASET,
                "plane": plane if plane != "oblique" else "",
            }
            stem = f"{subject_id}_{source.filename.removesuffix('.dcm')}_{variant}"
            answers = {"modality": MODALITY_NAMES[source.modality]}
            if plane in ANSWER_SPACES["view"]:
                answers["view"] = plane
            organ = ORGAN_OF_ANATOMY.get(source.anatomy)
            if organ is not None:
                answers["organ"] = organ
            for task, answer in answers.items():
                item_id = f"{stem}_{task}_mc_{PHRASING}"
                collected.rows.append(cube_item(seed, item_id, task, answer, base))


def build(size: str, seed: int = 0, progress: bool = True) -> tuple[pd.DataFrame, dict[str, bytes]]:
    """Build the manifest and images of ``cube`` at ``size`` for ``seed``."""
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r} for {SUITE}; choose from {', '.join(SIZES)}")
    plans = plan_subjects(size, seed)
    collected = Collected()
    anatomy.load_atlas()
    with tqdm(total=len(plans) + 1, desc=f"{SUITE} {size}", unit="subject",
              disable=not progress, leave=False) as bar:  # fmt: skip
        for plan in plans:
            _brain_images(size, seed, plan, collected)
            bar.update(1)
        _dicom_images(size, seed, collected)
        bar.update(1)
    return frame_from_rows(collected.rows), collected.images


def axis_counts(manifest: pd.DataFrame) -> dict[str, dict[str, int]]:
    """Items per task, hierarchy, modality and anatomy (for reports and tests)."""
    return {
        axis: {str(k): int(v) for k, v in manifest[axis].value_counts().sort_index().items()}
        for axis in ("task", "hierarchy", "modality", "anatomy")
    }
