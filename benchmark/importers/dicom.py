"""Import DICOM series, labelled from their metadata.

Every file under PATH is read as DICOM (except ``DICOMDIR``, hidden files and files whose suffix
says they are something else: .txt, .json, .csv, ...; a file that is not DICOM is an error, a
DICOM object without pixel data, such as a structured report, is passed over). Image files are
grouped into series by SeriesInstanceUID and a series' slices are ordered along the slice normal
(ImagePositionPatient), or by InstanceNumber without positions. Slices at depths 0.4, 0.5 and 0.6
of the series (one image for a single-slice series) are stored.

Labels, each from metadata only:

- modality: the Modality attribute (asked as the low-level "modality" task where Vigil can phrase
  it; the image's modality column keeps the DICOM code).
- plane: from ImageOrientationPatient (:func:`benchmark.importers.common.plane_from_orientation`);
  none for oblique slices or files without it.
- sequence (MR only): :func:`sequence_from_metadata`, from SeriesDescription / ProtocolName and the
  timing parameters RepetitionTime, EchoTime, InversionTime; "unknown" (and no sequence item) where
  the metadata does not say.
- is_brain: "yes" for an MR series whose body part, descriptions or protocol name a head study;
  "no" for any other modality, or an MR series whose metadata shows a non-head study
  (:func:`benchmark.suites.controls.non_brain_evidence`); not asked otherwise. A "no" image is a
  control, asked is_brain and the abstention prompt, as the brain-MRI suite's controls are.

Patient and series identifiers are replaced by pseudonyms (hashes): no patient data is stored.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmark import format as fmt
from benchmark.importers.common import (
    DEPTHS,
    IMPORT_FORMATS,
    ITEM_FORMAT,
    PHRASING,
    SEQUENCES,
    Collected,
    askable,
    control_items,
    plane_from_orientation,
    pseudonym,
)
from benchmark.suites.controls import non_brain_evidence
from benchmark.suites.imaging import normalise, pad_square, resize
from benchmark.suites.items import Question, image_items

DATASET = "dicom"
SKIP_SUFFIXES = {".txt", ".md", ".json", ".xml", ".csv", ".html", ".pdf", ".zip", ".py", ".log"}
HEAD_WORDS = ("HEAD", "BRAIN", "SKULL", "CRAN", "NEURO", "CEREB")

# Keywords in SeriesDescription / ProtocolName, checked in this order (first match wins).
_SEQUENCE_WORDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("FLAIR", ("FLAIR", "DARK FLUID", "DARK-FLUID")),
    ("DWI", ("DWI", "DIFFUSION", "TRACE", "ADC", "DTI", "EP2D_DIFF")),
    ("MRA", ("MRA", "TOF", "ANGIO")),
    ("PD", ("PD", "PROTON DENSITY", "PDW")),
    ("T2", ("T2",)),
    ("T1", ("T1", "MPRAGE", "SPGR", "BRAVO", "FSPGR", "TFE")),
)
_CONTRAST_WORDS = ("POST", "+C", "GAD", "GD", "CONTRAST", " CE", "_CE", "-CE", "T1CE", "T1C")


def _words(text: str) -> str:
    return f" {text.upper().replace('_', ' ').replace('-', ' ')} "


def sequence_from_metadata(
    description: str,
    repetition_ms: float | None,
    echo_ms: float | None,
    inversion_ms: float | None,
    contrast_agent: str = "",
) -> str:
    """An MR series' sequence from its description and timing, or "unknown".

    The description decides when it names a sequence (FLAIR, DWI, MRA, PD, T2, T1; T1 with a
    contrast word such as POST, GAD or +C, or a ContrastBolusAgent, is T1ce). Otherwise timing:
    TI >= 1500 ms with TE >= 70 ms is FLAIR; TR <= 800 ms with TE <= 30 ms is T1 (T1ce with a
    contrast agent); TR >= 2000 ms with TE >= 80 ms is T2; TR >= 1500 ms with TE <= 40 ms is PD.
    """
    text = _words(description)
    raw = description.upper()
    contrast = bool(contrast_agent.strip()) or any(w in f" {raw}" for w in _CONTRAST_WORDS)
    for label, words in _SEQUENCE_WORDS:
        for word in words:
            token = f" {word} "
            if token in text or (len(word) > 3 and word in raw):
                if label == "T1" and contrast:
                    return "T1ce"
                return label
    tr, te, ti = repetition_ms, echo_ms, inversion_ms
    if ti is not None and te is not None and ti >= 1500 and te >= 70:
        return "FLAIR"
    if tr is not None and te is not None:
        if tr <= 800 and te <= 30:
            return "T1ce" if contrast else "T1"
        if tr >= 2000 and te >= 80:
            return "T2"
        if tr >= 1500 and te <= 40:
            return "PD"
    return "unknown"


def _number(ds: Any, keyword: str) -> float | None:
    value = ds.get(keyword, None)
    if value is None or value == "":
        return None
    try:
        number = float(value[0] if isinstance(value, list | tuple) else value)
    except (TypeError, ValueError, IndexError):
        return None
    return number if np.isfinite(number) else None


def _text(ds: Any, keyword: str) -> str:
    value = ds.get(keyword, "")
    return "" if value is None else str(value)


def is_head_study(ds: Any) -> bool:
    texts = " ".join(
        _text(ds, k)
        for k in ("BodyPartExamined", "StudyDescription", "SeriesDescription", "ProtocolName")
    ).upper()
    return any(word in texts for word in HEAD_WORDS)


@dataclass
class _Slice:
    file: Path
    ds: Any
    frame: int
    position: float | None
    instance: int


def _grey_frame(ds: Any, frame: int) -> np.ndarray:
    from pydicom.pixels import apply_color_lut, apply_modality_lut

    pixels = ds.pixel_array
    frames = int(ds.get("NumberOfFrames", 1) or 1)
    photometric = _text(ds, "PhotometricInterpretation")
    if frames > 1:
        pixels = pixels[frame]
    if photometric == "PALETTE COLOR":
        pixels = apply_color_lut(pixels, ds)
    values = np.asarray(pixels, dtype=np.float64)
    if values.ndim == 3:
        values = values[..., :3] @ np.array([0.299, 0.587, 0.114])
    else:
        values = np.asarray(apply_modality_lut(values, ds), dtype=np.float64)
    if photometric == "MONOCHROME1":
        values = values.max() - values
    return values


def _sop_class_name(ds: Any) -> str:
    """The name of a dataset's SOP class ("MR Image Storage"), or "" when it has none."""
    meta = getattr(ds, "file_meta", None)
    uid = ds.get("SOPClassUID", None) or (meta.get("MediaStorageSOPClassUID") if meta else None)
    return str(getattr(uid, "name", "") or "")


def _read(file: Path, problems: list[str]) -> Any | None:
    import pydicom
    from pydicom.errors import InvalidDicomError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return pydicom.dcmread(str(file))
    except InvalidDicomError:
        problems.append(f"{file}: not a DICOM file")
    except Exception as exc:  # truncated or corrupt files raise many kinds
        problems.append(f"{file}: unreadable DICOM ({type(exc).__name__}: {exc})")
    return None


def collect(path: Path, seed: int = 0) -> Collected:
    """Read every DICOM series under ``path`` (problems are collected, not raised)."""
    collected = Collected()
    if not path.is_dir():
        collected.problems.append(f"{path}: not a folder")
        return collected
    files = sorted(
        p
        for p in path.rglob("*")
        if p.is_file()
        and not p.name.startswith(".")
        and p.name.upper() != "DICOMDIR"
        and p.suffix.lower() not in SKIP_SUFFIXES
    )
    series: dict[str, list[_Slice]] = defaultdict(list)
    for file in files:
        ds = _read(file, collected.problems)
        if ds is None:
            continue
        if "PixelData" not in ds:
            kind = _sop_class_name(ds)
            if "Image" in kind:
                collected.problems.append(f"{file}: {kind} object without pixel data (truncated?)")
            continue  # not an image (a structured report, presentation state, ...)
        missing = [k for k in ("Modality", "SeriesInstanceUID") if not _text(ds, k)]
        if missing:
            collected.problems.append(f"{file}: missing {', '.join(missing)}")
            continue
        frames = int(ds.get("NumberOfFrames", 1) or 1)
        position = None
        orientation = ds.get("ImageOrientationPatient", None)
        origin = ds.get("ImagePositionPatient", None)
        if orientation is not None and origin is not None and len(orientation) == 6:
            try:
                normal = np.cross([float(v) for v in orientation[:3]],
                                  [float(v) for v in orientation[3:]])  # fmt: skip
                position = float(np.dot(normal, [float(v) for v in origin]))
            except (TypeError, ValueError):
                position = None
        instance = int(_number(ds, "InstanceNumber") or 0)
        for frame in range(frames):
            series[str(ds.SeriesInstanceUID)].append(_Slice(file, ds, frame, position, instance))
    if not files:
        collected.problems.append(f"{path}: no files")
    for uid in sorted(series):
        try:
            _import_series(uid, series[uid], seed, collected)
        except Exception as exc:  # metadata no check foresaw: name the series rather than crash
            where = series[uid][0].file.parent
            collected.problems.append(
                f"{where}: series {pseudonym('series', uid)} cannot be imported "
                f"({type(exc).__name__}: {exc})"
            )
    return collected


def _import_series(uid: str, slices: list[_Slice], seed: int, collected: Collected) -> None:
    slices.sort(key=lambda s: (s.position if s.position is not None else 0.0, s.instance, s.frame))
    first = slices[0].ds
    problems: list[str] = []
    shapes = {(int(s.ds.get("Rows", 0)), int(s.ds.get("Columns", 0))) for s in slices}
    if len(shapes) > 1:
        problems.append(f"{slices[0].file.parent}: series {pseudonym('series', uid)} mixes "
                        f"slice sizes {sorted(shapes)}")  # fmt: skip
    modality = _text(first, "Modality").upper()
    plane = ""
    orientation = first.get("ImageOrientationPatient", None)
    if orientation is not None:
        try:
            plane = plane_from_orientation(list(orientation))
        except ValueError as exc:
            problems.append(f"{slices[0].file}: {exc}")
    if plane == "oblique":
        plane = ""  # no plane item for an oblique acquisition
    sequence = ""
    if modality == "MR":
        sequence = sequence_from_metadata(
            " ".join(_text(first, k) for k in ("SeriesDescription", "ProtocolName")),
            _number(first, "RepetitionTime"),
            _number(first, "EchoTime"),
            _number(first, "InversionTime"),
            _text(first, "ContrastBolusAgent"),
        )
    if modality != "MR" or (not is_head_study(first) and non_brain_evidence(first) is not None):
        is_brain = "no"
    elif is_head_study(first):
        is_brain = "yes"
    else:
        is_brain = ""
    if problems:
        collected.problems.extend(problems)
        return
    n = len(slices)
    picks = sorted({int(np.floor(d * (n - 1) + 0.5)) for d in DEPTHS}) if n > 1 else [0]
    subject = pseudonym("patient", _text(first, "PatientID") or uid)
    series_id = pseudonym("series", uid)
    base = {
        "subject_id": subject,
        "media_type": "image/png",
        "is_control": is_brain == "no",
        "modality": modality,
        "anatomy": "brain" if is_brain == "yes" else (_text(first, "BodyPartExamined").lower()
                                                       or "unknown"),
        "dataset": DATASET,
        "plane": plane,
        "sequence": sequence,
    }  # fmt: skip
    for k in picks:
        item = slices[k]
        try:
            values = _grey_frame(item.ds, item.frame)
        except Exception as exc:  # a missing codec or corrupt pixel data
            collected.problems.append(
                f"{item.file}: pixel data does not decode ({type(exc).__name__}: {exc})"
            )
            continue
        if values.ndim != 2 or min(values.shape) < 2:
            collected.problems.append(f"{item.file}: image of shape {values.shape} is not 2-D")
            continue
        png = fmt.encode_png(resize(pad_square(normalise(values))))
        image_path = collected.add_image(png)
        depth = k / (n - 1) if n > 1 else float("nan")
        variant = f"{series_id}_s{k:04d}"
        row_base = {**base, "image_path": image_path, "depth": float(depth)}
        modality_row = _modality_row(seed, variant, modality, row_base)
        if modality_row is not None:
            collected.rows.append(modality_row)
        if is_brain == "no":
            collected.rows.extend(control_items(seed, variant, row_base))
            continue
        answers = {"plane": plane, "is_brain": is_brain}
        if sequence in SEQUENCES:
            answers["sequence"] = sequence
        questions = [
            Question(task, answers[task])
            for task in ("sequence", "plane", "is_brain")
            if answers.get(task) and askable(task)
        ]
        collected.rows.extend(
            image_items(seed, variant, questions, row_base, IMPORT_FORMATS, (PHRASING,))
        )


def _modality_row(seed: int, variant: str, modality: str, base: dict) -> dict | None:
    """The low-level modality question, phrased as in the cube suite (None for other codes)."""
    from benchmark.suites.cube import modality_item

    return modality_item(seed, f"{variant}_modality_{ITEM_FORMAT}_cube", modality, base)
