"""The BraTS, IXI and NIfTI + CSV importers, on small volumes the tests write themselves.

Labels are checked against a recomputation from the arrays the tests made (in RAS order, before
they were stored, some in a flipped orientation): the slice index from the brain's extent, the
lesion voxels in that exact slice, and the side of the lesion against the mid-sagittal line.
"""

from __future__ import annotations

import functools
import io
import math

import nibabel as nib
import numpy as np
import pytest
from PIL import Image

from benchmark import format as fmt
from benchmark.errors import BenchmarkInvalid
from benchmark.importers import run_import
from benchmark.importers.common import (
    foreground_extent,
    laterality,
    plane_from_orientation,
    tumor_visible,
)

SHAPE = (40, 44, 36)
CENTER = np.array([20.0, 22.0, 18.0])
RADII = np.array([15.0, 18.0, 13.0])
AXIS = {"sagittal": 0, "coronal": 1, "axial": 2}
SEQ_LEVEL = {"t1n": 80.0, "t1c": 90.0, "t2w": 150.0, "t2f": 120.0}


@functools.lru_cache(maxsize=1)
def _grid() -> np.ndarray:
    return np.stack(np.meshgrid(*(np.arange(n, dtype=float) for n in SHAPE), indexing="ij"))


@functools.lru_cache(maxsize=1)
def brain_mask() -> np.ndarray:
    g = _grid()
    return (((g - CENTER[:, None, None, None]) / RADII[:, None, None, None]) ** 2).sum(0) <= 1


def lesion_labels(center: tuple[float, float, float], radius: float) -> np.ndarray:
    """A BraTS-style lesion (1 core, 3 enhancing, 2 oedema) in RAS array order."""
    g = _grid()
    r = np.sqrt(((g - np.array(center)[:, None, None, None]) ** 2).sum(0))
    seg = np.zeros(SHAPE, dtype=np.uint8)
    seg[r <= radius] = 2
    seg[r <= 0.7 * radius] = 3
    seg[r <= 0.4 * radius] = 1
    return seg * brain_mask()


def intensity(level: float, seg: np.ndarray | None, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    vol = np.where(brain_mask(), level, 0.0) + rng.normal(0, 1.0, SHAPE)
    if seg is not None:
        vol = np.where(seg > 0, level * 1.4, vol)
    return vol.astype(np.float32)


def save(path, ras: np.ndarray, flip_x: bool = False, zooms=(1.0, 1.0, 1.0)) -> None:
    """Store a RAS array; with ``flip_x`` as LAS (the x axis reversed, the affine says so)."""
    affine = np.diag([*zooms, 1.0])
    data = ras
    if flip_x:
        data = ras[::-1]
        affine[0, 0] = -zooms[0]
        affine[0, 3] = (SHAPE[0] - 1) * zooms[0]
    nib.save(nib.Nifti1Image(np.ascontiguousarray(data), affine), str(path))


SUBJECTS = {
    # name: (lesion centre, radius, stored flipped?)
    "BraTS-GLI-00001-000": ((11.0, 22.0, 18.0), 5.0, False),  # subject's left (low x)
    "BraTS-GLI-00002-000": ((29.0, 20.0, 17.0), 6.0, True),  # right, stored as LAS
    "BraTS-GLI-00003-000": ((20.0, 24.0, 18.0), 6.5, False),  # across the midline
}


@pytest.fixture(scope="module")
def brats_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("brats")
    for k, (name, (center, radius, flip)) in enumerate(SUBJECTS.items()):
        folder = root / "train" / name
        folder.mkdir(parents=True)
        seg = lesion_labels(center, radius)
        save(folder / f"{name}-seg.nii.gz", seg.astype(np.int16), flip)
        for j, (suffix, level) in enumerate(SEQ_LEVEL.items()):
            save(folder / f"{name}-{suffix}.nii.gz", intensity(level, seg, 10 * k + j), flip)
    return root


@pytest.fixture(scope="module")
def brats_bench(brats_dir, tmp_path_factory):
    store = tmp_path_factory.mktemp("store")
    return run_import("brats", brats_dir, store, name="brats-test")


def extent(axis: int) -> tuple[int, int]:
    """The brain's extent along an axis: slices holding at least 0.5 % of the fullest slice."""
    counts = brain_mask().sum(axis=tuple(a for a in range(3) if a != axis))
    hits = np.nonzero(counts >= 0.005 * counts.max())[0]
    return int(hits[0]), int(hits[-1])


@functools.lru_cache(maxsize=64)
def expected_slice(name: str, plane: str, depth: float) -> tuple[int, str]:
    """Lesion voxels and side of one cut, recomputed from the arrays the test made."""
    center, radius, _ = SUBJECTS[name]
    seg = lesion_labels(center, radius) > 0
    axis = AXIS[plane]
    lo, hi = extent(axis)
    index = int(math.floor(lo + depth * (hi - lo) + 0.5))
    cut = np.take(seg, index, axis=axis)
    count = int(cut.sum())
    x_lo, x_hi = extent(0)
    midline = (x_lo + x_hi) / 2
    if count < 25:
        return count, "none"
    if plane == "sagittal":  # the slice's own side; on the midline itself the lesion crosses it
        return count, "bilateral" if index == midline else ("right" if index > midline else "left")
    xs = np.nonzero(cut)[0]
    left, right = int((xs < midline).sum()), int((xs > midline).sum())
    if left >= 25 and right >= 25:
        return count, "bilateral"
    return count, "right" if xs.mean() > midline else "left"


def test_brats_labels_match_the_masks(brats_bench):
    items = brats_bench.items()
    assert set(items["sequence"]) == {"T1", "T1ce", "T2", "FLAIR"}
    assert set(items["task"]) >= {"sequence", "plane", "is_brain", "tumor_visible", "laterality"}
    assert set(items["depth"]) == {0.4, 0.5, 0.6}
    sides = set()
    for row in items.to_dict(orient="records"):
        count, side = expected_slice(row["subject_id"], row["plane"], row["depth"])
        assert row["tumor_voxels"] == count, row["item_id"]
        assert row["laterality"] == side, row["item_id"]
        if row["task"] == "tumor_visible":
            assert row["answer"] == ("yes" if count >= 25 else "no")
        if row["task"] == "laterality":
            assert row["answer"] == side
            sides.add(side)
        if row["task"] in ("plane", "sequence"):
            assert row["answer"] == row[row["task"]]
        assert row["answer"] in list(row["options"])
        if row["format"] == "mc":
            assert row["option_order"] == "|".join(row["options"])
            assert row["answer_letter"] == fmt.letter(list(row["options"]).index(row["answer"]))
        assert row["hierarchy"] in ("low", "mid", "high")
        if count >= 25:
            assert {"tumor", "lesion", "edema"} <= set(row["supported_findings"])
    assert sides == {"left", "right", "bilateral", "none"}
    assert set(items["format"]) == {"mc", "open"}


def test_brats_images_are_common_size_pngs(brats_bench):
    items = brats_bench.items()
    for path in sorted(set(items["image_path"]))[:6]:
        with Image.open(io.BytesIO(brats_bench.read_image(path))) as im:
            assert im.format == "PNG" and im.size == (128, 128)


def test_flipped_storage_gives_the_same_images(tmp_path, brats_dir):
    """A subject stored as LAS is reoriented: same pixels as when stored as RAS."""
    name = "BraTS-GLI-00002-000"
    center, radius, _ = SUBJECTS[name]
    for flip, sub in ((True, "a"), (False, "b")):
        folder = tmp_path / sub / name
        folder.mkdir(parents=True)
        seg = lesion_labels(center, radius)
        save(folder / f"{name}-seg.nii.gz", seg.astype(np.int16), flip)
        for j, (suffix, level) in enumerate(SEQ_LEVEL.items()):
            save(folder / f"{name}-{suffix}.nii.gz", intensity(level, seg, j), flip)
    a = run_import("brats", tmp_path / "a", tmp_path / "s1", name="x").items()
    b = run_import("brats", tmp_path / "b", tmp_path / "s2", name="x").items()
    assert a["image_path"].tolist() == b["image_path"].tolist()
    assert a["answer"].tolist() == b["answer"].tolist()


def test_brats_malformed_input_names_every_file(tmp_path, brats_dir):
    import shutil

    src = tmp_path / "bad"
    shutil.copytree(brats_dir, src)
    s1, s2, s3 = (src / "train" / n for n in SUBJECTS)
    (s1 / f"{s1.name}-seg.nii.gz").unlink()
    (s2 / f"{s2.name}-t2w.nii.gz").write_bytes(b"not a nifti file")
    save(s3 / f"{s3.name}-t1c.nii.gz", np.zeros((10, 10, 10), dtype=np.float32))
    store = tmp_path / "store"
    with pytest.raises(BenchmarkInvalid) as err:
        run_import("brats", src, store)
    text = "\n".join(err.value.problems)
    assert f"{s1}: missing {s1.name}-seg.nii.gz" in text
    assert f"{s2 / (s2.name + '-t2w.nii.gz')}: unreadable NIfTI" in text
    assert f"{s3 / (s3.name + '-t1c.nii.gz')}: shape (10, 10, 10) differs" in text
    assert not store.exists() or not any(store.iterdir())


def test_ixi_is_healthy_and_parses_names(tmp_path):
    for subject, site in (("IXI002", "Guys-0828"), ("IXI012", "HH-1211")):
        for k, seq in enumerate(("T1", "T2", "PD", "MRA")):
            folder = tmp_path / "ixi" / seq
            folder.mkdir(parents=True, exist_ok=True)
            save(folder / f"{subject}-{site}-{seq}.nii.gz", intensity(50 + 20 * k, None, k),
                 zooms=(0.94, 0.94, 1.2))  # fmt: skip
    bench = run_import("ixi", tmp_path / "ixi", tmp_path / "store")
    items = bench.items()
    assert set(items["subject_id"]) == {"IXI002", "IXI012"}
    assert set(items["dataset"]) == {"ixi-guys", "ixi-hh"}
    assert set(items["sequence"]) == {"T1", "T2", "PD", "MRA"}
    assert (items["tumor_voxels"] == 0).all()
    assert set(items.loc[items.task == "tumor_visible", "answer"]) == {"no"}
    assert set(items.loc[items.task == "laterality", "answer"]) == {"none"}
    assert bench.meta.name == "ixi-ixi"

    (tmp_path / "ixi" / "T1" / "subject7.nii.gz").write_bytes(b"")
    with pytest.raises(BenchmarkInvalid) as err:
        run_import("ixi", tmp_path / "ixi", tmp_path / "store2")
    assert any("subject7.nii.gz: not an IXI file name" in p for p in err.value.problems)


def test_nifti_csv(tmp_path):
    data = tmp_path / "site"
    (data / "vols").mkdir(parents=True)
    seg = lesion_labels((11.0, 22.0, 18.0), 5.0)
    save(data / "vols" / "a_t2.nii.gz", intensity(100, seg, 1))
    save(data / "vols" / "a_mask.nii.gz", seg.astype(np.uint8))
    save(data / "vols" / "b_flair.nii.gz", intensity(100, None, 2))
    save(data / "vols" / "knee.nii.gz", intensity(60, None, 3))
    (data / "labels.csv").write_text(
        "image,subject_id,sequence,mask,healthy,is_brain,anatomy\n"
        "vols/a_t2.nii.gz,a,T2,vols/a_mask.nii.gz,,,\n"
        "vols/b_flair.nii.gz,b,FLAIR,,yes,,\n"
        "vols/knee.nii.gz,k,unknown,,,no,knee\n"
    )
    items = run_import("nifti", data, tmp_path / "store").items()
    a = items[items.subject_id == "a"]
    assert set(a.loc[a.task == "laterality", "answer"]) <= {"left", "none"}
    assert "left" in set(a["laterality"])
    assert set(items.loc[items.subject_id == "b", "laterality"]) == {"none"}
    knee = items[items.subject_id == "k"]
    assert set(knee["task"]) == {"is_brain", "abstention"}
    assert set(knee.loc[knee.task == "is_brain", "answer"]) == {"no"}
    assert set(knee.loc[knee.task == "abstention", "answer"]) == {fmt.UNSURE}
    assert knee.loc[knee.task == "abstention", "expect_abstain"].all()
    assert knee["is_control"].all() and set(knee["anatomy"]) == {"knee"}
    assert "sequence" not in set(items.loc[items.subject_id == "k", "task"])

    (data / "labels.csv").write_text(
        "image,subject_id,sequence,mask\n"
        "../outside.nii.gz,a,T2,\n"
        "vols/a_t2.nii.gz,a,T3,\n"
        "vols/missing.nii.gz,c,T1,\n"
    )
    with pytest.raises(BenchmarkInvalid) as err:
        run_import("nifti", data / "labels.csv", tmp_path / "store2")
    text = "\n".join(err.value.problems)
    assert "labels.csv:2: image '../outside.nii.gz' contains '..'" in text
    assert "labels.csv:3: unknown sequence 'T3'" in text
    assert "missing.nii.gz: missing" in text
    (data / "labels.csv").write_text("path,subject\nx,y\n")
    with pytest.raises(BenchmarkInvalid, match="missing column"):
        run_import("nifti", data, tmp_path / "store3")


def test_pure_labels():
    mask = np.zeros((20, 20), dtype=bool)
    mask[2:7, 5:10] = True  # 25 voxels at low x: the subject's left
    assert tumor_visible(25) and not tumor_visible(24)
    assert laterality(mask, "axial", 0, 10.0) == "left"
    assert laterality(mask[::-1], "coronal", 0, 9.5) == "right"
    mask[12:17, 5:10] = True
    assert laterality(mask, "axial", 0, 10.0) == "bilateral"
    assert laterality(mask, "sagittal", 3, 10.0) == "left"
    assert laterality(mask, "sagittal", 14, 10.0) == "right"
    assert laterality(mask[:, :4], "axial", 0, 10.0) == "none"
    assert plane_from_orientation([1, 0, 0, 0, 1, 0]) == "axial"
    assert plane_from_orientation([1, 0, 0, 0, 0, -1]) == "coronal"
    assert plane_from_orientation([0, 1, 0, 0, 0, -1]) == "sagittal"
    assert plane_from_orientation([1, 0, 0, 0, 0.7071, 0.7071]) == "oblique"
    volume = np.zeros((10, 12, 8))
    volume[2:5, 3:9, 1:7] = 100
    assert foreground_extent(volume) == ((2, 4), (3, 8), (1, 6))
    assert fmt.FINDINGS  # the vocabulary the findings come from


def test_cli_import_errors_list_every_problem(brats_dir, tmp_path, capsys):
    from benchmark.cli import main

    store = tmp_path / "store"
    assert main(["benchmark", "import", "brats", str(brats_dir), "--root", str(store)]) == 0
    # 3 subjects x 4 sequences x (3 planes x 3 depths) x 5 tasks x 2 formats
    assert f"items     {3 * 4 * 9 * 5 * 2}" in capsys.readouterr().out
    empty = tmp_path / "empty"
    (empty / "a").mkdir(parents=True)
    (empty / "a" / "a-t1n.nii.gz").write_bytes(b"garbage")
    assert main(["benchmark", "import", "brats", str(empty), "--root", str(store)]) == 1
    err = capsys.readouterr().err
    assert f"{empty / 'a'}: missing a-t1c.nii.gz, a-t2w.nii.gz, a-t2f.nii.gz, a-seg.nii.gz" in err
    assert "1 problem; nothing written" in err and "Traceback" not in err
    assert main(["benchmark", "import", "brats", str(brats_dir), "--name", "Bad Name"]) == 2
    assert "name 'Bad Name'" in capsys.readouterr().err
