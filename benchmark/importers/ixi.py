"""Import the IXI dataset: healthy subjects' T1, T2, PD and MRA volumes.

IXI names every file ``IXI<number>-<site>-<id>-<sequence>.nii.gz`` (site Guys, HH or IOP;
sequence T1, T2, PD or MRA); the files of one subject may sit in one folder or in one folder per
sequence, anywhere under PATH. A subject's volumes are cut and labelled separately (IXI's
sequences are not on one grid). IXI subjects are healthy volunteers: every slice is labelled
tumour-free ("no", laterality "none"). Any other ``.nii``/``.nii.gz`` file under PATH is an error.
"""

from __future__ import annotations

import re
from pathlib import Path

from benchmark.importers.common import Collected, SubjectSource, import_subject

DATASET = "ixi"
SEQUENCES: dict[str, str] = {"T1": "T1", "T2": "T2", "PD": "PD", "MRA": "MRA"}
_NAME_RE = re.compile(r"^(IXI\d+)-([A-Za-z]+)-(\d+)-(T1|T2|PD|MRA)\.nii(\.gz)?$")


def collect(path: Path, seed: int = 0) -> Collected:
    """Read every IXI volume under ``path`` (problems are collected, not raised)."""
    collected = Collected()
    if not path.is_dir():
        collected.problems.append(f"{path}: not a folder")
        return collected
    files = sorted(p for p in path.rglob("*.nii*") if p.is_file())
    seen: dict[tuple[str, str], Path] = {}
    for file in files:
        match = _NAME_RE.match(file.name)
        if match is None:
            collected.problems.append(
                f"{file}: not an IXI file name (expected IXI<n>-<site>-<id>-<T1|T2|PD|MRA>.nii.gz)"
            )
            continue
        subject, site, _, sequence = match.group(1), match.group(2), match.group(3), match.group(4)
        if (subject, sequence) in seen:
            collected.problems.append(
                f"{file}: second {sequence} volume of {subject} (first: {seen[subject, sequence]})"
            )
            continue
        seen[subject, sequence] = file
        source = SubjectSource(
            subject_id=subject,
            volumes=((SEQUENCES[sequence], file),),
            dataset=f"{DATASET}-{site.lower()}",
            healthy=True,
        )
        import_subject(source, seed, collected)
    if not files:
        collected.problems.append(f"{path}: no IXI volumes (*.nii.gz) found")
    return collected
