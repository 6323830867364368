"""The ``brain-mri`` suite: the brain-MRI audit protocol on synthetic subjects, plus controls.

Every brain slice is asked five questions (sequence, plane, is_brain, tumor_visible, laterality);
every control is asked is_brain and the abstention prompt (right answer: ``UNSURE``). Each
question is asked in the size's formats (multiple choice, open-ended) and phrasings (neutral,
terse, clinician). Labels come from how the image was made: plane and depth from where the slice
was cut, the sequence from the contrast it was rendered with, tumor_visible, laterality and the
supported findings from the lesion mask of that exact slice (:mod:`benchmark.suites.labels`).

Subjects are split by subject into ``train`` and ``audit`` (stratified by tumour status; controls
are always ``audit``): the gateway replays audit items, a reference model may train on the rest.

Everything is drawn from generators seeded by ``(seed, purpose, index...)``, so the same seed gives
byte-identical images and manifest whatever the order or process subjects are built in.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from tqdm import tqdm

from benchmark import format as fmt
from benchmark.suites import anatomy
from benchmark.suites.controls import ControlImage, ControlPlan, MriSlice, build_controls
from benchmark.suites.imaging import pad_square, to_image
from benchmark.suites.items import Question, image_items
from benchmark.suites.labels import TUMOR_MIN_VOXELS as TUMOR_MIN_VOXELS
from benchmark.suites.labels import SliceLabels, slice_labels

SUITE = "brain-mri"
BRAIN_TASKS: tuple[str, ...] = ("sequence", "plane", "is_brain", "tumor_visible", "laterality")
CONTROL_TASKS: tuple[str, ...] = ("is_brain", "abstention")
SEQUENCES: tuple[str, ...] = ("T1", "T1ce", "T2", "FLAIR", "PD")
"""Sequences the suite renders. MRA and DWI stay distractor options only: the tissue-contrast
model has no flowing blood or diffusion to render them from."""
DATASET = "mni152-synthetic"
_LESION_SIDES = ("left", "right", "midline", "left", "right")
_CORRUPT_INDEX = 100_000  # subject indices of the healthy subjects corrupted controls come from


@dataclass(frozen=True)
class SizeSpec:
    """What one size of the suite contains."""

    subjects: int
    tumor_subjects: int
    depths: tuple[float, ...]
    healthy_sequences: tuple[int, int]  # (sequences a healthy subject has, rendered per position)
    tumor_sequences: tuple[int, int]  # the same for a tumour-bearing subject
    lesion_classes: tuple[str, ...]
    lesion_band: tuple[tuple[float, float], tuple[float, float]]
    controls: ControlPlan
    formats: tuple[str, ...]
    phrasings: tuple[str, ...]  # asked on every image
    extra_phrasings: tuple[str, ...]  # asked on a subset of subjects and on every control
    extra_fraction: float  # share of subjects asked the extra phrasings
    train_fraction: float  # share of subjects (per tumour status) in the train split


# For tests and `make run`: 12 subjects (6 with a tumour), 4 of them (2 with a tumour) in the
# train split. A run replays the audit split: 8 subjects x 6 slices x 5 tasks + 13 controls x 2
# tasks = 266 items; the train split adds 120. Multiple choice with the neutral phrasing only.
# Lesions are medium or large and centred near the middle of the brain, so depth-0.5 axial and
# coronal slices of tumour-bearing subjects cut them.
_SMALL = SizeSpec(
    subjects=12,
    tumor_subjects=6,
    depths=(0.5,),
    healthy_sequences=(2, 2),
    tumor_sequences=(2, 2),
    lesion_classes=("medium", "large"),
    lesion_band=((0.42, 0.58), (0.42, 0.58)),
    controls=ControlPlan(
        dicom_variants=("original",), noise=(2, 1, 1), blank=1, corrupted=(1, 1, 1)
    ),
    formats=("mc",),
    phrasings=("neutral",),
    extra_phrasings=(),
    extra_fraction=0.0,
    train_fraction=1 / 3,
)

SIZES: dict[str, SizeSpec] = {
    "small": _SMALL,
    # The same images and split with every format and phrasing (2,316 items): the whole
    # protocol, small.
    "small-full": replace(
        _SMALL, formats=("mc", "open"), extra_phrasings=("terse", "clinician"), extra_fraction=1.0
    ),
    # The paper's scale: 250 subjects, 150 tumour-bearing (BraTS-like: 4 of the 5 sequences, one
    # per slice position, 9 slices) and 100 healthy (IXI-like: 3 sequences at every position, 27
    # slices): 4,050 slices and 85 controls, 4,135 images. Every slice and control is asked every
    # task in both formats with the neutral phrasing; the terse and clinician phrasings are asked
    # on a seeded 20% of subjects and on every control (57,000 items or so).
    "paper": SizeSpec(
        subjects=250,
        tumor_subjects=150,
        depths=(0.4, 0.5, 0.6),
        healthy_sequences=(3, 3),
        tumor_sequences=(4, 1),
        # Large lesions twice as likely, centred in the middle third of the brain: about 56% of a
        # tumour subject's slices show the tumour (BraTS in the paper: 840 of 1,350).
        lesion_classes=("small", "medium", "large", "large"),
        lesion_band=((0.35, 0.65), (0.42, 0.62)),
        controls=ControlPlan(
            dicom_variants=("original", "mirrored", "cropped", "rotated"),
            noise=(14, 13, 13),
            blank=10,
            corrupted=(5, 5, 5),
        ),
        formats=("mc", "open"),
        phrasings=("neutral",),
        extra_phrasings=("terse", "clinician"),
        extra_fraction=0.2,
        train_fraction=0.2,
    ),
}


@dataclass(frozen=True)
class SubjectPlan:
    """How a subject is imaged, whether (and where) it has a lesion, and its split."""

    index: int
    sequences: tuple[str, ...]  # the sequences the subject was imaged with
    per_position: int  # how many of them are rendered at each slice position
    lesion_side: str | None
    lesion_class: str
    split: str
    extra_phrasings: bool

    @property
    def subject_id(self) -> str:
        return f"sub-{self.index + 1:04d}"

    def sequences_at(self, position: int) -> tuple[str, ...]:
        """The sequences rendered at slice position ``position`` (cycling through the subject's)."""
        n, k = len(self.sequences), self.per_position
        return tuple(self.sequences[(position * k + j) % n] for j in range(k))


@dataclass(frozen=True)
class SliceImage:
    """One stored brain slice and its labels."""

    subject_id: str
    plane: str
    depth: float
    sequence: str
    labels: SliceLabels
    png: bytes

    @property
    def tumor_voxels(self) -> int:
        return self.labels.tumor_voxels


def size_spec(size: str) -> SizeSpec:
    try:
        return SIZES[size]
    except KeyError:
        raise ValueError(
            f"unknown size {size!r} for {SUITE}; choose from {', '.join(SIZES)}"
        ) from None


def _pick_sequences(rng: np.random.Generator, count: int, carry: list[str]) -> tuple[str, ...]:
    """``count`` distinct sequences from a stream of seeded permutations of :data:`SEQUENCES`
    (``carry`` holds the stream's unused rest), so that every sequence is used about equally."""
    picked: list[str] = []
    while len(picked) < count:
        if not carry:
            carry.extend(SEQUENCES[i] for i in rng.permutation(len(SEQUENCES)))
        candidate = carry.pop(0)
        if candidate not in picked:
            picked.append(candidate)
    return tuple(picked)


def _stratified(rng: np.random.Generator, groups: list[list[int]], fraction: float) -> set[int]:
    """A seeded ``fraction`` of each group's members (rounded)."""
    chosen: set[int] = set()
    for members in groups:
        count = int(round(fraction * len(members)))
        chosen.update(int(members[i]) for i in rng.permutation(len(members))[:count])
    return chosen


@functools.lru_cache(maxsize=8)
def plan_subjects(size: str, seed: int) -> tuple[SubjectPlan, ...]:
    """The subjects of one size and seed: tumours, sequences, lesion sides, split, phrasings."""
    spec = size_spec(size)
    rng = np.random.default_rng([seed, 2])
    tumor = set(rng.permutation(spec.subjects)[: spec.tumor_subjects].tolist())
    seq_rng = np.random.default_rng([seed, 7])
    carry: list[str] = []
    groups = [
        [i for i in range(spec.subjects) if i in tumor],
        [i for i in range(spec.subjects) if i not in tumor],
    ]
    train = _stratified(np.random.default_rng([seed, 8]), groups, spec.train_fraction)
    extra = _stratified(np.random.default_rng([seed, 9]), groups, spec.extra_fraction)
    plans = []
    rank = 0
    for index in range(spec.subjects):
        lesion_class = spec.lesion_classes[int(rng.integers(len(spec.lesion_classes)))]
        side = None
        count, per_position = spec.healthy_sequences
        if index in tumor:
            side = _LESION_SIDES[rank % len(_LESION_SIDES)]
            rank += 1
            count, per_position = spec.tumor_sequences
        plans.append(
            SubjectPlan(
                index=index,
                sequences=_pick_sequences(seq_rng, count, carry),
                per_position=per_position,
                lesion_side=side,
                lesion_class=lesion_class,
                split="train" if index in train else "audit",
                extra_phrasings=index in extra,
            )
        )
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


def positions(size: str) -> list[tuple[str, float]]:
    """The slice positions of a size, in order: (plane, depth)."""
    return [(plane, depth) for plane in anatomy.PLANES for depth in size_spec(size).depths]


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


def _canvas() -> int:
    return max(anatomy.load_atlas().grid_shape)


def slice_pixels(sample: anatomy.SliceSample, sequence: str) -> np.ndarray:
    """The stored 128x128 uint8 image of a slice in ``sequence`` (noise, normalise, pad, resize).

    Every plane is padded to the same square (the grid's longest side), so a pixel covers the same
    distance in every plane.
    """
    noisy = sample.render(sequence, noise_rng(sample.subject, sample.plane, sample.depth, sequence))
    return to_image(noisy, canvas=_canvas())


def labels_of(sample: anatomy.SliceSample) -> SliceLabels:
    """The labels of a cut slice, from its own lesion mask."""
    f = sample.fields
    return slice_labels(f.lesion, f.lateral, f.core, sample.plane)


def render_subject(size: str, seed: int, index: int) -> list[SliceImage]:
    """All slices of one subject, in position (plane, depth) then sequence order."""
    plan = plan_subjects(size, seed)[index]
    subject = subject_for(size, seed, index)
    out = []
    for position, (plane, depth) in enumerate(positions(size)):
        sample = anatomy.extract_slice(subject, plane, depth)
        labels = labels_of(sample)
        for sequence in plan.sequences_at(position):
            png = fmt.encode_png(slice_pixels(sample, sequence))
            out.append(SliceImage(subject.subject_id, plane, depth, sequence, labels, png))
    return out


def corrupted_sources(size: str, seed: int) -> list[MriSlice]:
    """The brain slices the corrupted controls are made from: one per corrupted control, each of
    its own healthy subject (not part of the suite), at a seeded plane, depth and sequence."""
    spec = size_spec(size)
    out = []
    for m in range(sum(spec.controls.corrupted)):
        rng = np.random.default_rng([seed, 6, m])
        plane = anatomy.PLANES[int(rng.integers(len(anatomy.PLANES)))]
        depth = (0.4, 0.5, 0.6)[int(rng.integers(3))]
        sequence = SEQUENCES[int(rng.integers(len(SEQUENCES)))]
        subject = anatomy.make_subject(seed, _CORRUPT_INDEX + m, sequences=(sequence,))
        sample = anatomy.extract_slice(subject, plane, depth)
        noisy = sample.render(sequence, noise_rng(subject, plane, depth, sequence))
        out.append(MriSlice(pad_square(noisy, _canvas()), plane, sequence, depth))
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


def slice_answers(image: SliceImage) -> dict[str, str]:
    """The correct answer to each brain-slice task."""
    return {
        "sequence": image.sequence,
        "plane": image.plane,
        "is_brain": "yes",
        "tumor_visible": "yes" if image.labels.tumor_visible else "no",
        "laterality": image.labels.laterality,
    }


def slice_rows(
    seed: int, image: SliceImage, image_path: str, plan: SubjectPlan, spec: SizeSpec
) -> list[dict]:
    """The items about one brain slice."""
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
        "laterality": image.labels.laterality,
        "supported_findings": list(image.labels.findings),
        "split": plan.split,
        "image_missing": False,
        "source_json": "",
    }
    answers = slice_answers(image)
    questions = [Question(task, answers[task]) for task in BRAIN_TASKS]
    phrasings = spec.phrasings + (spec.extra_phrasings if plan.extra_phrasings else ())
    return image_items(seed, variant, questions, base, spec.formats, phrasings)


def control_rows(seed: int, control: ControlImage, image_path: str, spec: SizeSpec) -> list[dict]:
    """The items about one control: is_brain (yes only for a corrupted MRI) and abstention."""
    base = {
        "subject_id": control.subject_id,
        "image_path": image_path,
        "media_type": "image/png",
        "is_control": True,
        "modality": control.modality,
        "anatomy": control.anatomy,
        "dataset": control.dataset,
        "plane": control.plane,
        "sequence": control.sequence,
        "depth": float(control.depth),
        "tumor_voxels": -1,
        "laterality": "",
        "supported_findings": [],
        "split": "audit",
        "image_missing": False,
        "source_json": "",
    }
    questions = [
        Question("is_brain", "yes" if control.is_brain else "no"),
        Question("abstention", fmt.UNSURE),
    ]
    phrasings = spec.phrasings + spec.extra_phrasings
    return image_items(seed, control.subject_id, questions, base, spec.formats, phrasings)


def build(
    size: str, seed: int = 0, progress: bool = True, workers: int | None = None
) -> tuple[pd.DataFrame, dict[str, bytes]]:
    """Build the manifest and images of ``brain-mri`` at ``size`` for ``seed``.

    ``workers`` processes render subjects in parallel (default: up to 4 CPUs for large sizes);
    the output does not depend on it.
    """
    spec = size_spec(size)
    plans = plan_subjects(size, seed)
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
        for plan, slices in zip(plans, rendered, strict=True):
            for image in slices:
                path = fmt.image_path_for(image.png)
                images[path] = image.png
                rows.extend(slice_rows(seed, image, path, plan, spec))
            bar.update(1)
        for control in build_controls(seed, spec.controls, corrupted_sources(size, seed)):
            path = fmt.image_path_for(control.png)
            images[path] = control.png
            rows.extend(control_rows(seed, control, path, spec))
        bar.update(1)
    manifest = pd.DataFrame.from_records(rows, columns=list(fmt.COLUMNS))
    manifest = manifest.astype(
        {
            "is_control": bool,
            "image_missing": bool,
            "expect_abstain": bool,
            "depth": "float64",
            "tumor_voxels": "int64",
        }
    )
    return manifest, images
