"""Synthetic brain-MRI subjects built on the real MNI152 anatomy that nilearn ships.

The atlas (:func:`load_atlas`) is the 1 mm MNI152 grey-matter, white-matter and brain-mask maps;
CSF is the brain mask minus grey and white matter (soft maps, clipped to 0..1).

A subject (:func:`make_subject`) is the atlas seen through a small random affine (scale +-6 % per
axis, rotation +-6 degrees about each axis, shift up to 3 voxels), with a smooth multiplicative
bias field, a global intensity gain, per-tissue contrast jitter and Rician noise; a
tumour-bearing subject also has one lesion. Each subject lives on its own voxel grid: 1 mm
isotropic, the size of the atlas brain's bounding box plus an 8 voxel margin
(:attr:`Atlas.grid_shape`). That grid is "the volume": labels are counted on it.

Nothing is resampled in 3-D during a build. A slice of the subject volume is produced by mapping
just that slice's grid points into atlas space and sampling the maps there (trilinear); the lesion
is an analytic shape evaluated at the same atlas points, so image and lesion mask go through the
identical transform. :func:`subject_volumes` materialises the whole volume the same way, so tests
can check that a slice equals the matching plane of the volume.

Lesions follow the BraTS layout: a necrotic core inside an enhancing rim inside oedema, nested
ellipsoids whose boundaries are perturbed by a few random plane waves. The lesion mask is the
whole tumour (core + rim + oedema, BraTS "whole tumour"), restricted to the brain mask.

Orientation: grid axes follow the atlas (RAS: +i toward the subject's right, +j anterior, +k
superior). Slices are shown radiologically: axial with anterior at the top and the subject's right
on the image left; coronal with superior at the top and the subject's right on the left; sagittal
with superior at the top and anterior on the left.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
from scipy import ndimage

PLANES: tuple[str, ...] = ("axial", "coronal", "sagittal")
PLANE_AXIS: dict[str, int] = {"sagittal": 0, "coronal": 1, "axial": 2}
GENERATED_SEQUENCES: tuple[str, ...] = ("T1", "T2", "FLAIR", "PD", "T1ce")
"""Sequences the contrast model renders (the order fixes each one's noise stream)."""

GRID_MARGIN = 8
"""Voxels of margin around the atlas brain's bounding box in each subject grid."""

# Base intensities per sequence (arbitrary units, before bias, gain and noise).
# Healthy tissue: T1 WM > GM > CSF; T2 CSF > GM > WM; FLAIR suppresses CSF (GM > WM > CSF);
# PD is flat (CSF ~ GM, slightly above WM). Lesion: necrotic core, enhancing rim, oedema.
# T1ce is T1 after gadolinium: healthy tissue behind the blood-brain barrier does not change, the
# enhancing rim becomes the brightest tissue in the slice, the necrotic core stays dark.
CONTRAST: dict[str, dict[str, float]] = {
    "T1": {"csf": 0.15, "gm": 0.55, "wm": 0.85, "core": 0.20, "rim": 0.50, "edema": 0.42},
    "T1ce": {"csf": 0.15, "gm": 0.55, "wm": 0.85, "core": 0.20, "rim": 1.30, "edema": 0.45},
    "T2": {"csf": 1.00, "gm": 0.62, "wm": 0.45, "core": 0.95, "rim": 0.70, "edema": 0.86},
    "FLAIR": {"csf": 0.08, "gm": 0.62, "wm": 0.45, "core": 0.45, "rim": 0.80, "edema": 0.95},
    "PD": {"csf": 0.78, "gm": 0.75, "wm": 0.62, "core": 0.85, "rim": 0.78, "edema": 0.86},
}

LESION_CLASSES: dict[str, tuple[float, float]] = {
    "small": (7.0, 11.0),
    "medium": (12.0, 18.0),
    "large": (19.0, 27.0),
}
"""Lesion size classes: range of the mean oedema semi-axis, in mm."""

_EDGE = 0.06  # width of the soft lesion boundary, in units of the normalised lesion radius


@dataclass(frozen=True, eq=False)
class Atlas:
    """The MNI152 maps (1 mm, float32) and the geometry derived from them."""

    gm: np.ndarray  # cropped to the maps' support, C order
    wm: np.ndarray
    brain: np.ndarray
    crop_lo: np.ndarray  # (3,) atlas voxel index of the cropped maps' first voxel
    fortran: tuple[np.ndarray, np.ndarray, np.ndarray]  # gm, wm, brain again in Fortran order
    surface: np.ndarray  # (N, 3) atlas voxel coordinates of brain-mask boundary voxels
    brain_lo: np.ndarray  # (3,) brain-mask bounding box, atlas voxels (inclusive)
    brain_hi: np.ndarray
    midline_i: float  # atlas voxel index of MNI x = 0 (the mid-sagittal plane)
    grid_origin: np.ndarray  # (3,) atlas voxel coordinate of subject grid voxel (0, 0, 0)
    grid_shape: tuple[int, int, int]


@functools.lru_cache(maxsize=1)
def load_atlas() -> Atlas:
    """Load (once per process) the 1 mm MNI152 maps bundled with nilearn; no download."""
    from nilearn import datasets

    gm_img = datasets.load_mni152_gm_template(resolution=1)
    gm = np.asarray(gm_img.get_fdata(dtype=np.float32))
    wm = np.asarray(datasets.load_mni152_wm_template(resolution=1).get_fdata(dtype=np.float32))
    brain = np.asarray(datasets.load_mni152_brain_mask(resolution=1).get_fdata(dtype=np.float32))
    gm, wm, brain = (np.clip(a, 0.0, 1.0) for a in (gm, wm, brain))
    inside = brain >= 0.5
    boundary = inside & ~ndimage.binary_erosion(inside)
    surface = np.argwhere(boundary).astype(np.float64)
    idx = np.argwhere(inside)
    lo, hi = idx.min(axis=0), idx.max(axis=0)
    midline_i = float(np.linalg.solve(gm_img.affine[:3, :3], -gm_img.affine[:3, 3])[0])
    origin = (lo - GRID_MARGIN).astype(np.float64)
    shape = tuple(int(v) for v in (hi - lo + 1 + 2 * GRID_MARGIN))
    # Crop to where any map is non-zero (sampling outside gives 0 anyway): smaller, faster.
    support = np.argwhere((gm > 0) | (wm > 0) | (brain > 0))
    c_lo = np.maximum(support.min(axis=0) - 1, 0)
    c_hi = support.max(axis=0) + 2
    crop = tuple(slice(int(a), int(b)) for a, b in zip(c_lo, c_hi, strict=True))
    gm, wm, brain = (np.ascontiguousarray(a[crop]) for a in (gm, wm, brain))
    return Atlas(
        gm=gm,
        wm=wm,
        brain=brain,
        crop_lo=c_lo.astype(np.float64),
        fortran=(np.asfortranarray(gm), np.asfortranarray(wm), np.asfortranarray(brain)),
        surface=surface,
        brain_lo=lo.astype(np.float64),
        brain_hi=hi.astype(np.float64),
        midline_i=midline_i,
        grid_origin=origin,
        grid_shape=(shape[0], shape[1], shape[2]),
    )


@dataclass(frozen=True, eq=False)
class Lesion:
    """One tumour in atlas voxel coordinates (1 mm)."""

    center: np.ndarray  # (3,)
    axes: np.ndarray  # (3,) oedema semi-axes, mm
    rotation: np.ndarray  # (3, 3) columns are the ellipsoid axes
    core_frac: float  # necrotic core boundary, fraction of the oedema radius
    rim_frac: float  # enhancing rim outer boundary, fraction of the oedema radius
    wave_k: np.ndarray  # (W, 3) wave vectors of the boundary perturbation, rad/mm
    wave_phase: np.ndarray  # (W,)
    wave_amp: np.ndarray  # (W,)
    texture_k: np.ndarray  # (T, 3) wave vectors of the intensity texture inside the lesion
    texture_phase: np.ndarray  # (T,)
    side: str  # "left", "right" or "midline" (the subject's side)
    size_class: str


@dataclass(frozen=True, eq=False)
class Subject:
    """One synthetic subject: everything needed to render any slice of it deterministically."""

    index: int
    subject_id: str
    seed: int
    matrix: np.ndarray  # (3, 3) subject grid voxel -> atlas voxel, linear part
    offset: np.ndarray  # (3,) ... and translation: atlas = matrix @ v + offset
    gain: float
    noise_sigma: float
    bias: np.ndarray  # (9,) coefficients of the log bias field (quadratic polynomial)
    contrast: dict[str, dict[str, float]]
    sequences: tuple[str, ...]
    lesion: Lesion | None = None
    extent: tuple[tuple[float, float], ...] = field(default=())  # brain extent per grid axis

    @property
    def has_tumor(self) -> bool:
        return self.lesion is not None


def _rotation(angles: np.ndarray) -> np.ndarray:
    ax, ay, az = angles
    rx = np.array([[1, 0, 0], [0, np.cos(ax), -np.sin(ax)], [0, np.sin(ax), np.cos(ax)]])
    ry = np.array([[np.cos(ay), 0, np.sin(ay)], [0, 1, 0], [-np.sin(ay), 0, np.cos(ay)]])
    rz = np.array([[np.cos(az), -np.sin(az), 0], [np.sin(az), np.cos(az), 0], [0, 0, 1]])
    return rz @ ry @ rx


def _make_lesion(
    rng: np.random.Generator,
    atlas: Atlas,
    side: str,
    size_class: str,
    band: tuple[tuple[float, float], tuple[float, float]],
) -> Lesion:
    lo_r, hi_r = LESION_CLASSES[size_class]
    radius = rng.uniform(lo_r, hi_r)
    axes = radius * rng.uniform(0.8, 1.2, size=3)
    rotation = _rotation(rng.uniform(-np.pi, np.pi, size=3))
    tissue = atlas.gm + atlas.wm
    span = atlas.brain_hi - atlas.brain_lo
    center = None
    for _ in range(500):
        if side == "midline":
            x = atlas.midline_i + rng.uniform(-4.0, 4.0)
        else:
            offset = rng.uniform(18.0, 50.0)
            # RAS: the subject's left is toward lower atlas i.
            x = atlas.midline_i - offset if side == "left" else atlas.midline_i + offset
        y = atlas.brain_lo[1] + span[1] * rng.uniform(*band[0])
        z = atlas.brain_lo[2] + span[2] * rng.uniform(*band[1])
        ijk = tuple(np.round(np.array([x, y, z]) - atlas.crop_lo).astype(int))
        if atlas.brain[ijk] >= 0.5 and tissue[ijk] >= 0.6:
            center = np.array([x, y, z])
            break
    if center is None:  # pragma: no cover - the bands always hold brain tissue
        raise RuntimeError(f"could not place a {side} lesion inside the brain")
    n_waves = 6
    directions = rng.normal(size=(n_waves, 3))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    wavelengths = rng.uniform(8.0, 24.0, size=n_waves)
    n_texture = 4
    tex_dirs = rng.normal(size=(n_texture, 3))
    tex_dirs /= np.linalg.norm(tex_dirs, axis=1, keepdims=True)
    tex_lengths = rng.uniform(3.0, 8.0, size=n_texture)
    return Lesion(
        center=center,
        axes=axes,
        rotation=rotation,
        core_frac=float(rng.uniform(0.25, 0.40)),
        rim_frac=float(rng.uniform(0.50, 0.65)),
        wave_k=directions * (2 * np.pi / wavelengths)[:, None],
        wave_phase=rng.uniform(0, 2 * np.pi, size=n_waves),
        wave_amp=rng.uniform(0.03, 0.06, size=n_waves),
        texture_k=tex_dirs * (2 * np.pi / tex_lengths)[:, None],
        texture_phase=rng.uniform(0, 2 * np.pi, size=n_texture),
        side=side,
        size_class=size_class,
    )


def make_subject(
    seed: int,
    index: int,
    *,
    sequences: tuple[str, ...],
    lesion_side: str | None = None,
    lesion_class: str = "medium",
    lesion_band: tuple[tuple[float, float], tuple[float, float]] = ((0.2, 0.8), (0.35, 0.8)),
) -> Subject:
    """A subject drawn from ``np.random.default_rng([seed, 1, index])``.

    ``lesion_side`` ("left", "right", "midline" or None for a healthy subject) places the lesion;
    ``lesion_band`` bounds its centre along the anterior-posterior and inferior-superior axes as
    fractions of the atlas brain's extent.
    """
    atlas = load_atlas()
    rng = np.random.default_rng([seed, 1, index])
    scale = rng.uniform(0.94, 1.06, size=3)
    angles = np.deg2rad(rng.uniform(-6.0, 6.0, size=3))
    shift = rng.uniform(-3.0, 3.0, size=3)
    matrix = _rotation(angles) @ np.diag(scale)
    center = (atlas.brain_lo + atlas.brain_hi) / 2.0
    offset = center + matrix @ (atlas.grid_origin - center) + shift
    gain = float(rng.uniform(0.7, 1.3))
    noise_sigma = float(rng.uniform(0.01, 0.035))
    bias = rng.normal(0.0, 0.07, size=9)
    contrast = {
        seq: {tissue: value * float(rng.uniform(0.96, 1.04)) for tissue, value in table.items()}
        for seq, table in CONTRAST.items()
    }
    lesion = None
    if lesion_side is not None:
        lesion = _make_lesion(rng, atlas, lesion_side, lesion_class, lesion_band)

    # Brain extent on the subject grid: the atlas brain boundary carried into subject space.
    inverse = np.linalg.inv(matrix)
    grid_pts = (atlas.surface - offset) @ inverse.T
    extent = tuple((float(grid_pts[:, a].min()), float(grid_pts[:, a].max())) for a in range(3))
    return Subject(
        index=index,
        subject_id=f"sub-{index + 1:04d}",
        seed=seed,
        matrix=matrix,
        offset=offset,
        gain=gain,
        noise_sigma=noise_sigma,
        bias=bias,
        contrast=contrast,
        sequences=tuple(sequences),
        lesion=lesion,
        extent=extent,
    )


def slice_index(subject: Subject, plane: str, depth: float) -> int:
    """The grid index of the slice at fractional ``depth`` of the brain's extent along the plane's
    axis (sagittal: left to right; coronal: posterior to anterior; axial: inferior to superior)."""
    axis = PLANE_AXIS[plane]
    lo, hi = subject.extent[axis]
    index = int(np.floor(lo + depth * (hi - lo) + 0.5))
    return int(np.clip(index, 0, load_atlas().grid_shape[axis] - 1))


def plane_view(volume: np.ndarray, plane: str, index: int) -> np.ndarray:
    """The display-oriented 2-D slice of a subject-grid volume (see the module docstring)."""
    axis = PLANE_AXIS[plane]
    raw = np.take(volume, index, axis=axis)
    return np.ascontiguousarray(raw[::-1, ::-1].T)


def _to_atlas(subject: Subject, grid_points: np.ndarray) -> np.ndarray:
    """(3, N) subject grid coordinates -> (3, N) atlas voxel coordinates."""
    return subject.matrix @ grid_points + subject.offset[:, None]


def _sample(volume: np.ndarray, atlas_points: np.ndarray) -> np.ndarray:
    return ndimage.map_coordinates(
        volume, atlas_points, order=1, mode="constant", cval=0.0, prefilter=False
    ).astype(np.float32)


def _lesion_radius(lesion: Lesion, atlas_points: np.ndarray) -> np.ndarray:
    """Normalised, perturbed radius of each atlas point (< 1 inside the oedema boundary)."""
    rel = atlas_points.T - lesion.center
    local = rel @ lesion.rotation
    d = np.sqrt(np.sum((local / lesion.axes) ** 2, axis=1))
    waves = np.sin(atlas_points.T @ lesion.wave_k.T + lesion.wave_phase) @ lesion.wave_amp
    return (d * (1.0 + waves)).astype(np.float32)


def _ramp(x: np.ndarray) -> np.ndarray:
    return np.clip(0.5 + x / _EDGE, 0.0, 1.0)


@dataclass(frozen=True, eq=False)
class Fields:
    """Everything sampled at a set of grid points, in the points' shape. Sequence-independent."""

    gm: np.ndarray
    wm: np.ndarray
    csf: np.ndarray
    brain: np.ndarray
    core: np.ndarray  # soft lesion part weights (zeros for a healthy subject)
    rim: np.ndarray
    edema: np.ndarray
    lesion: np.ndarray  # bool: whole-tumour mask (core + rim + oedema) inside the brain mask
    texture: np.ndarray  # multiplicative intensity texture of the lesion (ones elsewhere)
    bias: np.ndarray
    lateral: np.ndarray  # signed distance from the mid-sagittal plane, mm (+: subject's right)

    def render(self, subject: Subject, sequence: str) -> np.ndarray:
        """Noise-free intensity of these points in ``sequence``."""
        c = subject.contrast[sequence]
        tissue = self.gm * c["gm"] + self.wm * c["wm"] + self.csf * c["csf"]
        whole = self.core + self.rim + self.edema
        lesion = self.core * c["core"] + self.rim * c["rim"] + self.edema * c["edema"]
        value = tissue * (1.0 - whole) + lesion * self.texture
        return (subject.gain * self.bias * value).astype(np.float32)


_FIELD_NAMES = (
    "gm", "wm", "csf", "brain", "core", "rim", "edema", "lesion", "texture", "bias", "lateral",
)  # fmt: skip


def sample_fields(subject: Subject, grid_points: np.ndarray, fortran: bool = False) -> Fields:
    """Sample maps, lesion and bias field at ``grid_points`` (shape (3, ...), subject grid).

    ``fortran`` samples the Fortran-ordered copy of the maps: the same values, faster when
    consecutive points step across the first atlas axis rather than the last (axial slices).
    """
    atlas = load_atlas()
    shape = grid_points.shape[1:]
    pts = grid_points.reshape(3, -1).astype(np.float64)
    atlas_pts = _to_atlas(subject, pts)
    local = atlas_pts - atlas.crop_lo[:, None]
    maps = atlas.fortran if fortran else (atlas.gm, atlas.wm, atlas.brain)
    gm, wm, brain = (_sample(m, local) for m in maps)
    csf = np.clip(brain - gm - wm, 0.0, 1.0)
    zeros = np.zeros_like(brain)
    core, rim, edema, mask = zeros, zeros, zeros, np.zeros(brain.shape, dtype=bool)
    texture = np.ones_like(brain)
    lesion = subject.lesion
    if lesion is not None:
        # The perturbation is at most sum(wave_amp) <= 0.36, so r < 1 needs d < 1 / 0.64.
        reach = float(lesion.axes.max()) / (1.0 - float(lesion.wave_amp.sum())) + 2.0
        near = np.all(np.abs(atlas_pts.T - lesion.center) <= reach, axis=1)
        if near.any():
            r = np.full(brain.shape, np.inf, dtype=np.float32)
            near_pts = atlas_pts[:, near]
            r[near] = _lesion_radius(lesion, near_pts)
            tex = np.sin(near_pts.T @ lesion.texture_k.T + lesion.texture_phase).mean(axis=1)
            texture[near] = 1.0 + 0.12 * tex
            whole = _ramp(1.0 - r) * brain
            inner = _ramp(lesion.rim_frac - r) * brain
            necro = _ramp(lesion.core_frac - r) * brain
            core, rim, edema = necro, inner - necro, whole - inner
            mask = (r < 1.0) & (brain >= 0.5)
    grid_shape = np.asarray(atlas.grid_shape, dtype=np.float64)
    u = (pts - (grid_shape[:, None] - 1) / 2.0) / (grid_shape[:, None] / 2.0)
    basis = np.stack([u[0], u[1], u[2], u[0] ** 2, u[1] ** 2, u[2] ** 2, u[0] * u[1],
                      u[0] * u[2], u[1] * u[2]])  # fmt: skip
    bias = np.exp(subject.bias @ basis).astype(np.float32)
    lateral = (atlas_pts[0] - atlas.midline_i).astype(np.float32)
    arrays = (gm, wm, csf, brain, core, rim, edema, mask, texture, bias, lateral)
    return Fields(*(a.reshape(shape) for a in arrays))


def _slice_grid(plane: str, index: int) -> np.ndarray:
    """Grid coordinates (3, n0, n1) of one slice in raw (array) orientation.

    Raw order keeps consecutive points close in memory when the atlas is sampled, which is several
    times faster than sampling in display order; :func:`_display` reorients afterwards.
    """
    shape = load_atlas().grid_shape
    axis = PLANE_AXIS[plane]
    others = [a for a in range(3) if a != axis]
    a0, a1 = np.meshgrid(
        np.arange(shape[others[0]], dtype=np.float64),
        np.arange(shape[others[1]], dtype=np.float64),
        indexing="ij",
    )
    coords: list[np.ndarray] = [a0, a0, a0]
    coords[axis] = np.full(a0.shape, float(index))
    coords[others[0]], coords[others[1]] = a0, a1
    return np.stack(coords)


def _display(fields: Fields) -> Fields:
    """Reorient raw-slice fields for display (the same flip and transpose as :func:`plane_view`)."""
    return Fields(*(np.ascontiguousarray(getattr(fields, n)[::-1, ::-1].T) for n in _FIELD_NAMES))


@dataclass(frozen=True, eq=False)
class SliceSample:
    """One slice of one subject: where it was cut and the fields sampled on it."""

    subject: Subject
    plane: str
    depth: float
    index: int
    fields: Fields

    @property
    def tumor_voxels(self) -> int:
        """Whole-tumour voxels in this slice, counted on the subject's 1 mm grid."""
        return int(self.fields.lesion.sum())

    def render(self, sequence: str, noise_rng: np.random.Generator | None = None) -> np.ndarray:
        """Intensity of this slice in ``sequence``; with Rician noise when ``noise_rng`` is given."""
        clean = self.fields.render(self.subject, sequence)
        if noise_rng is None:
            return clean
        sigma = np.float32(self.subject.noise_sigma * self.subject.gain)
        real = clean + sigma * noise_rng.standard_normal(clean.shape, dtype=np.float32)
        imag = sigma * noise_rng.standard_normal(clean.shape, dtype=np.float32)
        return np.sqrt(real * real + imag * imag)


def extract_slice(subject: Subject, plane: str, depth: float) -> SliceSample:
    """Cut the slice at ``depth`` in ``plane`` from the subject's volume."""
    index = slice_index(subject, plane, depth)
    grid = _slice_grid(plane, index)
    fields = _display(sample_fields(subject, grid, fortran=PLANE_AXIS[plane] == 2))
    return SliceSample(subject, plane, depth, index, fields)


def subject_volumes(subject: Subject) -> Fields:
    """The whole subject volume on its grid (for tests and inspection; a build never needs it)."""
    shape = load_atlas().grid_shape
    parts = []
    for i in range(shape[0]):
        j, k = np.meshgrid(np.arange(shape[1]), np.arange(shape[2]), indexing="ij")
        pts = np.stack([np.full(j.shape, float(i)), j.astype(np.float64), k.astype(np.float64)])
        parts.append(sample_fields(subject, pts))
    return Fields(*(np.stack([getattr(p, n) for p in parts]) for n in _FIELD_NAMES))
