"""Import a BraTS 2024 folder: one folder per subject with t1n, t1c, t2w, t2f and seg volumes.

Layout (as the challenge distributes it)::

    PATH/BraTS-GLI-00000-000/BraTS-GLI-00000-000-t1n.nii.gz   (native T1    -> "T1")
                            BraTS-GLI-00000-000-t1c.nii.gz   (T1 + contrast -> "T1ce")
                            BraTS-GLI-00000-000-t2w.nii.gz   (T2            -> "T2")
                            BraTS-GLI-00000-000-t2f.nii.gz   (T2-FLAIR      -> "FLAIR")
                            BraTS-GLI-00000-000-seg.nii.gz   (labels 1 NETC, 2 SNFH, 3 ET)

Subject folders may sit at any depth under PATH; ``.nii`` works as well as ``.nii.gz``. Every
subject must have all five files on one grid. Labels come from the segmentation of the exact slice
(whole tumour = any label > 0): tumour visible by the 25-voxel rule, laterality from the in-slice
centroid, and the findings the protocol derives (necrosis where the slice cuts label 1, NETC).
"""

from __future__ import annotations

from pathlib import Path

from benchmark.importers.common import Collected, SubjectSource, import_subject

DATASET = "brats2024"
SEQUENCE_SUFFIXES: dict[str, str] = {"t1n": "T1", "t1c": "T1ce", "t2w": "T2", "t2f": "FLAIR"}
SEG_SUFFIX = "seg"
CORE_LABEL = 1  # NETC, the necrotic core (2 is SNFH, oedema; 3 is ET, enhancing tumour)
_SUFFIXES = (*SEQUENCE_SUFFIXES, SEG_SUFFIX)


def _volume_file(folder: Path, suffix: str) -> Path | None:
    for ext in (".nii.gz", ".nii"):
        path = folder / f"{folder.name}-{suffix}{ext}"
        if path.is_file():
            return path
    return None


def _subject_folders(path: Path) -> list[Path]:
    """Folders holding at least one file named like a BraTS volume of that folder."""
    found = set()
    for file in path.rglob("*.nii*"):
        stem = file.name.removesuffix(".gz").removesuffix(".nii")
        if any(stem == f"{file.parent.name}-{s}" for s in _SUFFIXES):
            found.add(file.parent)
    return sorted(found)


def collect(path: Path, seed: int = 0) -> Collected:
    """Read every subject under ``path`` (problems are collected, not raised)."""
    collected = Collected()
    if not path.is_dir():
        collected.problems.append(f"{path}: not a folder")
        return collected
    folders = _subject_folders(path)
    if not folders:
        collected.problems.append(
            f"{path}: no BraTS subject folders (expected <subject>/<subject>-t1n.nii.gz, "
            "-t1c, -t2w, -t2f and -seg)"
        )
        return collected
    for folder in folders:
        files = {s: _volume_file(folder, s) for s in _SUFFIXES}
        missing = [s for s, f in files.items() if f is None]
        if missing:
            names = ", ".join(f"{folder.name}-{s}.nii.gz" for s in missing)
            collected.problems.append(f"{folder}: missing {names}")
            continue
        subject = SubjectSource(
            subject_id=folder.name,
            volumes=tuple((SEQUENCE_SUFFIXES[s], files[s]) for s in SEQUENCE_SUFFIXES),  # type: ignore[misc]
            dataset=DATASET,
            seg=files[SEG_SUFFIX],
        )
        import_subject(subject, seed, collected, core_label=CORE_LABEL)
    return collected
