"""Import a folder of NIfTI volumes labelled by a CSV file.

PATH is the CSV file, or a folder holding ``labels.csv``. One row per volume; paths are relative
to the CSV's folder and must stay inside it. Columns:

==============  ========  ===================================================================
column          required  meaning
==============  ========  ===================================================================
``image``       yes       the volume (``.nii`` or ``.nii.gz``, 3-D)
``subject_id``  yes       the subject (slices of one subject are resampled together)
``sequence``    yes       T1, T1ce, T2, FLAIR, PD, MRA, DWI, or ``unknown`` (no sequence item)
``mask``        no        lesion segmentation on the same grid (lesion where > 0): tumour
                          visibility and laterality are labelled from it
``healthy``     no        ``yes`` when the subject has no lesion (labels "no" / "none"
                          without a mask); default ``no``
``is_brain``    no        ``yes`` (default) or ``no``: a non-brain volume becomes a control
                          that is only asked whether it is a brain MRI
``modality``    no        default ``MR``
``anatomy``     no        default ``brain`` (or ``other`` when is_brain is no)
``dataset``     no        default the CSV folder's name
==============  ========  ===================================================================
"""

from __future__ import annotations

import csv
from pathlib import Path

from benchmark import format as fmt
from benchmark.importers.common import SEQUENCES, Collected, SubjectSource, import_subject

CSV_NAME = "labels.csv"
REQUIRED = ("image", "subject_id", "sequence")
OPTIONAL = ("mask", "healthy", "is_brain", "modality", "anatomy", "dataset")
_YES_NO = {"yes": True, "no": False, "true": True, "false": False, "1": True, "0": False}


def _inside(base: Path, value: str) -> tuple[Path | None, str | None]:
    why = fmt.path_escape_problem(value)
    if why is not None:
        return None, why
    path = (base / value).resolve()
    if not path.is_relative_to(base.resolve()):
        return None, "resolves outside the CSV's folder"
    return path, None


def collect(path: Path, seed: int = 0) -> Collected:
    """Read the CSV and every volume it names (problems are collected, not raised)."""
    collected = Collected()
    csv_path = path / CSV_NAME if path.is_dir() else path
    if not csv_path.is_file():
        collected.problems.append(f"{csv_path}: missing")
        return collected
    try:
        with open(csv_path, newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            header = [h.strip() for h in (reader.fieldnames or [])]
            rows = [{(k or "").strip(): (v or "").strip() for k, v in r.items()} for r in reader]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        collected.problems.append(f"{csv_path}: unreadable CSV ({exc})")
        return collected
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        collected.problems.append(
            f"{csv_path}: missing column(s) {', '.join(missing)} (required: {', '.join(REQUIRED)})"
        )
        return collected
    unknown = [c for c in header if c not in REQUIRED + OPTIONAL]
    if unknown:
        collected.problems.append(f"{csv_path}: unknown column(s) {', '.join(unknown)}")
    if not rows:
        collected.problems.append(f"{csv_path}: has no rows")
    base = csv_path.parent
    dataset_default = base.resolve().name.lower() or "nifti"
    seen: set[tuple[str, str]] = set()
    for line, row in enumerate(rows, start=2):
        where = f"{csv_path}:{line}"
        bad = []
        for column in REQUIRED:
            if not row.get(column):
                bad.append(f"{where}: {column} is empty")
        sequence = row.get("sequence", "")
        if sequence and sequence != "unknown" and sequence not in SEQUENCES:
            bad.append(
                f"{where}: unknown sequence {sequence!r} (use {', '.join(SEQUENCES)} or unknown)"
            )
        flags = {}
        for column, default in (("healthy", False), ("is_brain", True)):
            text = row.get(column, "").lower()
            if text and text not in _YES_NO:
                bad.append(f"{where}: {column} must be yes or no, got {row[column]!r}")
            flags[column] = _YES_NO.get(text, default)
        image = mask = None
        for column in ("image", "mask"):
            if row.get(column):
                resolved, why = _inside(base, row[column])
                if why is not None:
                    bad.append(f"{where}: {column} {row[column]!r} {why}")
                elif column == "image":
                    image = resolved
                else:
                    mask = resolved
        key = (row.get("subject_id", ""), row.get("image", ""))
        if key in seen:
            bad.append(f"{where}: volume {row.get('image')!r} listed twice for this subject")
        seen.add(key)
        if bad or image is None:
            collected.problems.extend(bad)
            continue
        source = SubjectSource(
            subject_id=row["subject_id"],
            volumes=((sequence, image),),
            dataset=row.get("dataset") or dataset_default,
            seg=mask,
            healthy=flags["healthy"],
            is_brain=flags["is_brain"],
            modality=row.get("modality") or "MR",
            anatomy=row.get("anatomy") or ("brain" if flags["is_brain"] else "other"),
        )
        import_subject(source, seed, collected)
    return collected
