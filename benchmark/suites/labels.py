"""Slice labels of the brain-MRI protocol, computed from the lesion mask of the exact slice.

- **Tumour visible**: at least :data:`TUMOR_MIN_VOXELS` whole-tumour voxels in the slice, counted on
  the subject's 1 mm grid.
- **Laterality** (the subject's side, not the side of the image): ``none`` unless the slice is
  tumour-positive. In an axial or coronal slice, ``bilateral`` when at least
  :data:`SIDE_MIN_VOXELS` lesion voxels lie on each side of the mid-sagittal plane (the lesion
  crosses the midline in this slice), else the side of the in-slice lesion centroid. A sagittal
  slice lies on one side of the head, so it takes the side of the slice itself where it cuts the
  lesion: the side of the in-slice lesion centroid, never ``bilateral``.
- **Supported findings** (for grading open-ended answers): a tumour-positive slice supports
  ``tumor``, ``lesion``, ``edema``, ``enhancement`` (every lesion has an enhancing rim), its
  laterality (``bilateral`` also supports ``left`` and ``right``: a lesion across the midline is on
  both sides), and ``necrosis`` when the slice cuts the necrotic core. A tumour-negative slice
  supports nothing, even if a few lesion voxels (below the threshold) are in it; the synthetic
  lesions displace no tissue, so ``mass_effect`` is never supported.

The side of a voxel is the sign of its distance from the mid-sagittal plane (MNI x = 0) carried
through the subject's affine: :attr:`benchmark.suites.anatomy.Fields.lateral`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TUMOR_MIN_VOXELS = 25
"""Whole-tumour voxels a slice needs to be tumour-positive (the paper's visibility threshold)."""

SIDE_MIN_VOXELS = 25
"""Lesion voxels needed on each side of the midline for an axial or coronal slice to be
``bilateral`` (the visibility threshold, applied per side)."""

CORE_MIN_WEIGHT = 0.5
"""A voxel belongs to the necrotic core when its core weight is at least this."""


@dataclass(frozen=True)
class SliceLabels:
    """The labels of one brain slice."""

    tumor_voxels: int
    laterality: str  # "left", "right", "bilateral" or "none"
    findings: tuple[str, ...]

    @property
    def tumor_visible(self) -> bool:
        return self.tumor_voxels >= TUMOR_MIN_VOXELS


def laterality(mask: np.ndarray, lateral: np.ndarray, plane: str) -> str:
    """The laterality label of a slice from its lesion mask and each voxel's signed distance from
    the mid-sagittal plane (negative: the subject's left)."""
    mask = np.asarray(mask, dtype=bool)
    if int(mask.sum()) < TUMOR_MIN_VOXELS:
        return "none"
    x = np.asarray(lateral, dtype=np.float64)[mask]
    if plane != "sagittal":
        left, right = int((x < 0).sum()), int((x > 0).sum())
        if left >= SIDE_MIN_VOXELS and right >= SIDE_MIN_VOXELS:
            return "bilateral"
    return "right" if float(x.mean()) > 0.0 else "left"


def supported_findings(tumor_voxels: int, side: str, core_voxels: int) -> tuple[str, ...]:
    """The canonical findings (:data:`benchmark.format.FINDINGS`) a slice's labels support."""
    if tumor_voxels < TUMOR_MIN_VOXELS:
        return ()
    found = ["tumor", "lesion", "edema", "enhancement"]
    if core_voxels > 0:
        found.append("necrosis")
    sides = {"left": ("left",), "right": ("right",), "bilateral": ("left", "right", "bilateral")}
    found.extend(f"laterality_{s}" for s in sides.get(side, ()))
    return tuple(found)


def slice_labels(
    mask: np.ndarray, lateral: np.ndarray, core: np.ndarray, plane: str
) -> SliceLabels:
    """All labels of one slice from its whole-tumour mask, lateral distances and core weights."""
    mask = np.asarray(mask, dtype=bool)
    voxels = int(mask.sum())
    side = laterality(mask, lateral, plane)
    core_voxels = int((mask & (np.asarray(core) >= CORE_MIN_WEIGHT)).sum())
    return SliceLabels(voxels, side, supported_findings(voxels, side, core_voxels))
