"""The ``brain-mri`` suite: slices of synthetic subjects on MNI152 anatomy, plus controls.

Every brain slice is asked four multiple-choice questions (sequence, plane, is_brain,
tumor_visible); every control only is_brain. Labels come from how the image was made: the plane
and depth from where the slice was cut, the sequence from the contrast it was rendered with, and
tumor_visible from the lesion mask of that exact slice on the subject's 1 mm grid (at least
:data:`TUMOR_MIN_VOXELS` whole-tumour voxels; the count is recorded in ``tumor_voxels``).

Everything is drawn from generators seeded by ``(seed, purpose, index...)``, so the same seed gives
byte-identical images and manifest whatever the order or process subjects are built in.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import multiprocessing
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
import pandas as pd
from tqdm import tqdm

from benchmark import format as fmt
from benchmark.prompts import TASK_OPTIONS, build_prompt
from benchmark.suites import anatomy
from benchmark.suites.controls import ControlImage, ControlPlan, build_controls
from benchmark.suites.imaging import to_image

SUITE = "brain-mri"
TUMOR_MIN_VOXELS = 25
BRAIN_TASKS: tuple[str, ...] = ("sequence", "plane", "is_brain", "tumor_visible")
CONTROL_TASKS: tuple[str, ...] = ("is_brain",)
PHRASING = "neutral"
ITEM_FORMAT = "mc"
DATASET = "mni152-synthetic"
_LESION_SIDES = ("left", "right", "midline", "left", "right")


@dataclass(frozen=True)
class SizeSpec:
    """What one size of the suite contains."""

    subjects: int
    tumor_subjects: int
    depths: tuple[float, ...]
    sequence_pool: tuple[str, ...]
    sequences_per_subject: int
    lesion_classes: tuple[str, ...]
    lesion_band: tuple[tuple[float, float], tuple[float, float]]
    controls: ControlPlan


SIZES: dict[str, SizeSpec] = {
    # About 300 items in a few seconds. Lesions are medium or large and centred near the middle of
    # the brain, so depth-0.5 axial and coronal slices of tumour-bearing subjects cut them.
    "small": SizeSpec(
        subjects=8,
        tumor_subjects=4,
        depths=(0.5,),
        sequence_pool=("T1", "T2", "FLAIR"),
        sequences_per_subject=3,
        lesion_classes=("medium", "large"),
        lesion_band=((0.42, 0.58), (0.42, 0.58)),
        controls=ControlPlan(dicom_variants=("original",), noise=(2, 1, 1), blank=1),
    ),
    # The paper's scale: 250 subjects (150 with a tumour), 3 planes x 3 depths x 2 sequences each,
    # 4,500 slices, and 70 controls.
    "paper": SizeSpec(
        subjects=250,
        tumor_subjects=150,
        depths=(0.4, 0.5, 0.6),
        sequence_pool=("T1", "T2", "FLAIR", "PD"),
        sequences_per_subject=2,
        lesion_classes=("small", "medium", "large"),
        lesion_band=((0.2, 0.8), (0.35, 0.8)),
        controls=ControlPlan(
            dicom_variants=("original", "mirrored", "cropped", "rotated"),
            noise=(14, 13, 13),
            blank=10,
        ),
    ),
}


@dataclass(frozen=True)
class SubjectPlan:
    """Which sequences a subject is imaged with and whether (and where) it has a lesion."""

    index: int
    sequences: tuple[str, ...]
    lesion_side: str | None
    lesion_class: str


@dataclass(frozen=True)
class SliceImage:
    """One stored brain slice and its labels."""

    subject_id: str
    plane: str
    depth: float
    sequence: str
    tumor_voxels: int
    png: bytes


def size_spec(size: str) -> SizeSpec:
    try:
        return SIZES[size]
    except KeyError:
        raise ValueError(
            f"unknown size {size!r} for {SUITE}; choose from {', '.join(SIZES)}"
        ) from None


@functools.lru_cache(maxsize=8)
def plan_subjects(size: str, seed: int) -> tuple[SubjectPlan, ...]:
    """The subjects of one size and seed (which have tumours, which sequences, lesion sides)."""
    spec = size_spec(size)
    rng = np.random.default_rng([seed, 2])
    tumor = set(rng.permutation(spec.subjects)[: spec.tumor_subjects].tolist())
    plans = []
    rank = 0
    for index in range(spec.subjects):
        if spec.sequences_per_subject >= len(spec.sequence_pool):
            sequences = spec.sequence_pool
        else:
            picked = rng.choice(len(spec.sequence_pool), spec.sequences_per_subject, replace=False)
            sequences = tuple(spec.sequence_pool[i] for i in sorted(picked.tolist()))
        lesion_class = spec.lesion_classes[int(rng.integers(len(spec.lesion_classes)))]
        side = None
        if index in tumor:
            side = _LESION_SIDES[rank % len(_LESION_SIDES)]
            rank += 1
        plans.append(SubjectPlan(index, sequences, side, lesion_class))
    return tuple(plans)


def subject_for(size: str, seed: int, index: int) -> anatomy.Subject:
    """The exact subject a build of (size, seed) uses at ``index``."""
    plan = plan_subjects(size, seed)[index]
    return anatomy.make_subject(
        seed,
        index,
        sequences=plan.sequences,
        lesion_side=plan.lesion_side,
        lesion_class=plan.lesion_class,
        lesion_band=size_spec(size).lesion_band,
    )


def noise_rng(
    subject: anatomy.Subject, plane: str, depth: float, sequence: str
) -> np.random.Generator:
    """The generator of the Rician noise of one rendered slice."""
    return np.random.default_rng(
        [
            subject.seed,
            5,
            subject.index,
            anatomy.PLANES.index(plane),
            int(round(depth * 1000)),
            anatomy.GENERATED_SEQUENCES.index(sequence),
        ]
    )


def slice_pixels(sample: anatomy.SliceSample, sequence: str) -> np.ndarray:
    """The stored 128x128 uint8 image of a slice in ``sequence`` (noise, normalise, pad, resize).

    Every plane is padded to the same square (the grid's longest side), so a pixel covers the same
    distance in every plane.
    """
    noisy = sample.render(sequence, noise_rng(sample.subject, sample.plane, sample.depth, sequence))
    return to_image(noisy, canvas=max(anatomy.load_atlas().grid_shape))


def render_subject(size: str, seed: int, index: int) -> list[SliceImage]:
    """All slices of one subject, in plane, depth, sequence order."""
    spec = size_spec(size)
    subject = subject_for(size, seed, index)
    out = []
    for plane in anatomy.PLANES:
        for depth in spec.depths:
            sample = anatomy.extract_slice(subject, plane, depth)
            for sequence in subject.sequences:
                png = fmt.encode_png(slice_pixels(sample, sequence))
                out.append(
                    SliceImage(subject.subject_id, plane, depth, sequence, sample.tumor_voxels, png)
                )
    return out


def _render_job(job: tuple[str, int, int]) -> list[SliceImage]:
    return render_subject(*job)


@contextlib.contextmanager
def _rendered(size: str, seed: int, workers: int) -> Iterator[Iterator[list[SliceImage]]]:
    """Subjects' slices in index order, rendered by ``workers`` processes.

    Workers are forked (sharing the loaded atlas) only while this process has no other threads;
    forking a threaded process (a gRPC server, say) can deadlock, so then they are spawned. Enter
    this before starting a progress bar: the pool is started on entry.
    """
    jobs = [(size, seed, i) for i in range(size_spec(size).subjects)]
    if workers <= 1:
        anatomy.load_atlas()
        yield map(_render_job, jobs)
        return
    method = "spawn"
    if threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods():
        anatomy.load_atlas()  # before forking, so the workers share the maps
        method = "fork"
    context = multiprocessing.get_context(method)
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        yield pool.map(_render_job, jobs, chunksize=4)  # submits every job now


def _option_order(seed: int, item_id: str, options: tuple[str, ...]) -> list[str]:
    key = int.from_bytes(hashlib.sha256(item_id.encode()).digest()[:8], "big")
    order = np.random.default_rng([seed, 4, key]).permutation(len(options))
    return [options[i] for i in order]


def _item(seed: int, item_id: str, task: str, answer: str, base: dict) -> dict:
    options = _option_order(seed, item_id, TASK_OPTIONS[task])
    return {
        "item_id": item_id,
        **base,
        "task": task,
        "format": ITEM_FORMAT,
        "phrasing": PHRASING,
        "prompt": build_prompt(task, options, phrasing=PHRASING, item_format=ITEM_FORMAT),
        "options": options,
        "answer": answer,
        "answer_letter": fmt.letter(options.index(answer)),
        "option_order": fmt.OPTION_SEPARATOR.join(options),
    }


def slice_answers(image: SliceImage) -> dict[str, str]:
    """The correct answer to each brain-slice task."""
    return {
        "sequence": image.sequence,
        "plane": image.plane,
        "is_brain": "yes",
        "tumor_visible": "yes" if image.tumor_voxels >= TUMOR_MIN_VOXELS else "no",
    }


def slice_rows(seed: int, image: SliceImage, image_path: str) -> list[dict]:
    variant = f"{image.subject_id}_{image.sequence}_{image.plane}_d{round(image.depth * 100):03d}"
    base = {
        "subject_id": image.subject_id,
        "image_path": image_path,
        "media_type": "image/png",
        "is_control": False,
        "modality": "MR",
        "anatomy": "brain",
        "dataset": DATASET,
        "plane": image.plane,
        "sequence": image.sequence,
        "depth": float(image.depth),
        "tumor_voxels": int(image.tumor_voxels),
    }
    answers = slice_answers(image)
    return [
        _item(seed, f"{variant}_{task}_{ITEM_FORMAT}_{PHRASING}", task, answers[task], base)
        for task in BRAIN_TASKS
    ]


def control_rows(seed: int, control: ControlImage, image_path: str) -> list[dict]:
    base = {
        "subject_id": control.subject_id,
        "image_path": image_path,
        "media_type": "image/png",
        "is_control": True,
        "modality": control.modality,
        "anatomy": control.anatomy,
        "dataset": control.dataset,
        "plane": "",
        "sequence": "",
        "depth": float("nan"),
        "tumor_voxels": -1,
    }
    return [
        _item(seed, f"{control.subject_id}_{task}_{ITEM_FORMAT}_{PHRASING}", task, "no", base)
        for task in CONTROL_TASKS
    ]


def build(
    size: str, seed: int = 0, progress: bool = True, workers: int | None = None
) -> tuple[pd.DataFrame, dict[str, bytes]]:
    """Build the manifest and images of ``brain-mri`` at ``size`` for ``seed``.

    ``workers`` processes render subjects in parallel (default: up to 4 CPUs for large sizes);
    the output does not depend on it.
    """
    spec = size_spec(size)
    if workers is None:
        workers = min(os.cpu_count() or 1, 4) if spec.subjects > 32 else 1
    rows: list[dict] = []
    images: dict[str, bytes] = {}
    with (
        _rendered(size, seed, workers) as rendered,
        tqdm(
            total=spec.subjects + 1,
            desc=f"{SUITE} {size}",
            unit="subject",
            disable=not progress,
            leave=False,
        ) as bar,
    ):
        for slices in rendered:
            for image in slices:
                path = fmt.image_path_for(image.png)
                images[path] = image.png
                rows.extend(slice_rows(seed, image, path))
            bar.update(1)
        for control in build_controls(seed, spec.controls):
            path = fmt.image_path_for(control.png)
            images[path] = control.png
            rows.extend(control_rows(seed, control, path))
        bar.update(1)
    manifest = pd.DataFrame.from_records(rows, columns=list(fmt.COLUMNS))
    manifest = manifest.astype({"is_control": bool, "depth": "float64", "tumor_voxels": "int64"})
    return manifest, images
