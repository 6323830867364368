"""Negative controls: images a model should not read as a diagnostic brain MRI.

Four kinds, each control its own subject:

- ``dicom``: real non-brain medical images from the test files pydicom ships (a chest CT, an
  abdominal MR, three ultrasound studies). Each source is kept only if its own metadata shows it is
  not a head study (:func:`non_brain_evidence`) and it decodes with pydicom alone: the sources are
  uncompressed, so no optional codec (pylibjpeg, GDCM) can change what a build contains.
- ``noise``: gaussian, salt-and-pepper and uniform noise.
- ``blank``: a constant grey level.
- ``corrupted``: a brain MRI slice (of a healthy synthetic subject that appears nowhere else)
  ruined by an acquisition artefact: heavy blur, motion ghosting, or a k-space spike
  (:func:`corrupt`). It is still an image of a brain made by MRI, so its ``is_brain`` answer is
  "yes"; it is not of diagnostic quality, so the abstention prompt expects ``UNSURE`` on it like
  on every other control.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from benchmark.format import encode_png
from benchmark.suites.imaging import IMAGE_SIZE, normalise, pad_square, resize, to_image

if TYPE_CHECKING:
    from pydicom import Dataset


@dataclass(frozen=True)
class DicomSource:
    """A pydicom test file used as a control, with what its metadata says it shows."""

    filename: str
    modality: str
    anatomy: str


DICOM_SOURCES: tuple[DicomSource, ...] = (
    DicomSource("CT_small.dcm", "CT", "chest"),
    DicomSource("examples_overlay.dcm", "MR", "abdomen"),
    DicomSource("examples_palette.dcm", "US", "obstetric"),
    DicomSource("examples_rgb_color.dcm", "US", "lymph node"),
    DicomSource("ExplVR_BigEnd.dcm", "US", "heart"),
)

DICOM_VARIANTS: tuple[str, ...] = ("original", "mirrored", "cropped", "rotated")
NOISE_KINDS: tuple[str, ...] = ("gaussian", "salt_and_pepper", "uniform")
CORRUPTIONS: tuple[str, ...] = ("blur", "ghosting", "spike")

_HEAD_WORDS = ("HEAD", "BRAIN", "SKULL", "CRAN", "NEURO", "CEREB", "CQ500")
_NON_HEAD_IMAGE_TYPES = {
    "OBSTETRICAL": "obstetric ultrasound",
    "SMALL PARTS": "small-parts ultrasound",
    "EPICARDIAL": "epicardial (cardiac) ultrasound",
    "ABDOMINAL": "abdominal study",
}
_HEAD_FOV_MM = 300.0  # head CT is reconstructed at a field of view well under 30 cm


@dataclass(frozen=True)
class ControlImage:
    """One control image, ready to store."""

    subject_id: str
    kind: str  # "dicom", "noise", "blank" or "corrupted"
    detail: str  # source file and variant, noise kind, grey level, or corruption
    modality: str
    anatomy: str
    dataset: str
    png: bytes
    plane: str = ""  # corrupted MRI only: where the source slice was cut and how it was rendered
    sequence: str = ""
    depth: float = float("nan")

    @property
    def is_brain(self) -> bool:
        """Whether the image shows a brain (only a corrupted MRI does)."""
        return self.kind == "corrupted"


@dataclass(frozen=True)
class MriSlice:
    """A rendered brain slice to corrupt: float intensities on the square canvas, and metadata."""

    values: np.ndarray
    plane: str
    sequence: str
    depth: float


@dataclass(frozen=True)
class ControlPlan:
    """How many controls of each kind a benchmark size holds."""

    dicom_variants: tuple[str, ...]
    noise: tuple[int, int, int]  # gaussian, salt-and-pepper, uniform
    blank: int
    corrupted: tuple[int, int, int] = (0, 0, 0)  # blur, ghosting, k-space spike

    @property
    def count(self) -> int:
        dicom = len(DICOM_SOURCES) * len(self.dicom_variants)
        return dicom + sum(self.noise) + self.blank + sum(self.corrupted)


def non_brain_evidence(ds: Dataset) -> str | None:
    """What in a DICOM dataset's metadata shows it is not a head study, or None if nothing does.

    Any head word in the body part, descriptions, protocol or patient id rules a file out; then one
    of: a non-head BodyPartExamined, a non-head ultrasound ImageType, or a CT reconstructed at a
    body-sized field of view.
    """
    get = ds.get
    body_part = str(get("BodyPartExamined", "") or "").upper()
    texts = " ".join(
        str(get(k, "") or "")
        for k in ("BodyPartExamined", "StudyDescription", "SeriesDescription", "ProtocolName",
                  "PatientID", "PatientName")
    ).upper()  # fmt: skip
    if any(word in texts for word in _HEAD_WORDS):
        return None
    if body_part:
        return f"BodyPartExamined is {body_part}"
    image_type = {str(v).upper() for v in (get("ImageType", []) or [])}
    for marker, what in _NON_HEAD_IMAGE_TYPES.items():
        if marker in image_type:
            return f"ImageType says {what}"
    fov = get("ReconstructionDiameter", None)
    if str(get("Modality", "")) == "CT" and fov is not None and float(fov) >= _HEAD_FOV_MM:
        return f"CT reconstructed at a {float(fov):.0f} mm (body) field of view"
    return None


def _grey(ds: Dataset) -> np.ndarray:
    """The first frame of a DICOM image as float greyscale."""
    from pydicom.pixels import apply_color_lut

    pixels = ds.pixel_array
    photometric = str(ds.PhotometricInterpretation)
    frames = int(getattr(ds, "NumberOfFrames", 1) or 1)
    if frames > 1:
        pixels = pixels[0]
    if photometric == "PALETTE COLOR":
        pixels = apply_color_lut(pixels, ds)
    values = np.asarray(pixels, dtype=np.float64)
    if values.ndim == 3:
        values = values[..., :3] @ np.array([0.299, 0.587, 0.114])
    if photometric == "MONOCHROME1":
        values = values.max() - values
    return values


def load_dicom_source(source: DicomSource) -> np.ndarray:
    """Read a pydicom test file, check its metadata, and return it as float greyscale.

    Raises ValueError when the file's metadata does not match the source table or does not show a
    non-head study.
    """
    import pydicom
    from pydicom.data import get_testdata_file

    path = get_testdata_file(source.filename)
    if path is None:
        raise ValueError(f"pydicom test file {source.filename} is missing")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = pydicom.dcmread(path)
        if str(ds.get("Modality", "")) != source.modality:
            raise ValueError(f"{source.filename}: modality is not {source.modality}")
        if non_brain_evidence(ds) is None:
            raise ValueError(f"{source.filename}: metadata does not show a non-head study")
        return _grey(ds)


def _dicom_variant(values: np.ndarray, variant: str) -> np.ndarray:
    if variant == "mirrored":
        return values[:, ::-1]
    if variant == "cropped":
        h, w = values.shape
        dh, dw = h // 8, w // 8
        return values[dh : h - dh, dw : w - dw]
    if variant == "rotated":
        return np.rot90(values)
    return values


def _noise(kind: str, rng: np.random.Generator) -> np.ndarray:
    shape = (IMAGE_SIZE, IMAGE_SIZE)
    if kind == "gaussian":
        values = rng.normal(rng.uniform(90, 170), rng.uniform(25, 70), size=shape)
    elif kind == "salt_and_pepper":
        values = np.full(shape, rng.uniform(40, 200))
        hits = rng.random(shape) < rng.uniform(0.05, 0.4)
        values[hits] = np.where(rng.random(int(hits.sum())) < 0.5, 0.0, 255.0)
    else:
        values = rng.uniform(0, 256, size=shape)
    return np.clip(np.floor(values), 0, 255).astype(np.uint8)


def corrupt(values: np.ndarray, kind: str, rng: np.random.Generator) -> np.ndarray:
    """A square float image ruined by one acquisition artefact (magnitude, same shape).

    - ``blur``: a gaussian blur of 5-8 voxels sigma, which wipes out every edge a reader needs.
    - ``ghosting``: periodic motion during the acquisition: each phase-encode line of k-space is
      shifted by a sinusoidal displacement of 4-10 voxels, which replicates the head as ghosts
      along the phase-encode direction.
    - ``spike``: one corrupt k-space sample far from the centre, strong enough that its stripe
      pattern covers the whole image (a "herringbone" artefact).
    """
    from scipy import ndimage

    values = np.asarray(values, dtype=np.float64)
    if kind == "blur":
        return ndimage.gaussian_filter(values, sigma=rng.uniform(5.0, 8.0), mode="constant")
    k = np.fft.fft2(values)
    n_rows, n_cols = values.shape
    if kind == "ghosting":
        ky = np.fft.fftfreq(n_rows)[:, None]  # cycles per voxel along the phase-encode axis
        kx = np.fft.fftfreq(n_cols)[None, :]
        period = rng.uniform(3.0, 8.0)  # phase-encode lines per motion cycle
        line = np.arange(n_rows)[:, None]
        shift = rng.uniform(4.0, 10.0) * np.sin(2 * np.pi * line / period + rng.uniform(0, 6.3))
        k = k * np.exp(-2j * np.pi * (ky * shift + kx * 0.3 * shift))
    elif kind == "spike":
        row = int(rng.integers(n_rows // 10, n_rows // 4)) * int(rng.choice([-1, 1]))
        col = int(rng.integers(n_cols // 10, n_cols // 4)) * int(rng.choice([-1, 1]))
        strength = rng.uniform(1.0, 2.0) * np.abs(values).sum()
        k[row, col] += strength * np.exp(1j * rng.uniform(0, 2 * np.pi))
    else:
        raise ValueError(f"unknown corruption {kind!r}; known: {', '.join(CORRUPTIONS)}")
    return np.abs(np.fft.ifft2(k))


def build_controls(
    seed: int, plan: ControlPlan, mri_slices: Sequence[MriSlice] = ()
) -> list[ControlImage]:
    """The controls of one benchmark, in a fixed order, each from its own seeded generator.

    ``mri_slices`` are the brain slices to corrupt, one per corrupted control in plan order
    (``sum(plan.corrupted)`` of them).
    """
    if len(mri_slices) != sum(plan.corrupted):
        raise ValueError(
            f"the plan corrupts {sum(plan.corrupted)} MRI slices, {len(mri_slices)} were given"
        )
    controls: list[ControlImage] = []
    k = 0
    for variant in plan.dicom_variants:
        for source in DICOM_SOURCES:
            k += 1
            values = _dicom_variant(load_dicom_source(source), variant)
            pixels = resize(pad_square(normalise(values)))
            controls.append(
                ControlImage(
                    subject_id=f"control-dicom-{k:03d}",
                    kind="dicom",
                    detail=f"{source.filename}:{variant}",
                    modality=source.modality,
                    anatomy=source.anatomy,
                    dataset="pydicom-samples",
                    png=encode_png(pixels),
                )
            )
    n = 0
    for kind, count in zip(NOISE_KINDS, plan.noise, strict=True):
        for _ in range(count):
            n += 1
            rng = np.random.default_rng([seed, 3, 1, n])
            controls.append(
                ControlImage(
                    subject_id=f"control-noise-{n:03d}",
                    kind="noise",
                    detail=kind,
                    modality="noise",
                    anatomy="none",
                    dataset="synthetic-noise",
                    png=encode_png(_noise(kind, rng)),
                )
            )
    for b in range(plan.blank):
        rng = np.random.default_rng([seed, 3, 2, b])
        level = (0, 255)[b] if b < 2 else int(rng.integers(16, 240))
        controls.append(
            ControlImage(
                subject_id=f"control-blank-{b + 1:03d}",
                kind="blank",
                detail=f"level {level}",
                modality="blank",
                anatomy="none",
                dataset="synthetic-blank",
                png=encode_png(np.full((IMAGE_SIZE, IMAGE_SIZE), level, dtype=np.uint8)),
            )
        )
    m = 0
    for kind, count in zip(CORRUPTIONS, plan.corrupted, strict=True):
        for _ in range(count):
            mri = mri_slices[m]
            m += 1
            rng = np.random.default_rng([seed, 3, 3, m])
            pixels = to_image(corrupt(mri.values, kind, rng), canvas=mri.values.shape[0])
            controls.append(
                ControlImage(
                    subject_id=f"control-corrupt-{m:03d}",
                    kind="corrupted",
                    detail=f"{kind}:{mri.sequence}:{mri.plane}",
                    modality="MR",
                    anatomy="brain",
                    dataset="mni152-synthetic-corrupted",
                    png=encode_png(pixels),
                    plane=mri.plane,
                    sequence=mri.sequence,
                    depth=mri.depth,
                )
            )
    return controls
