"""The brain-mri suite, built for real at size ``small``; labels checked by recomputation."""

from __future__ import annotations

import io
import re
import warnings

import numpy as np
import pytest
from PIL import Image

from benchmark import format as fmt
from benchmark.prompts import TASK_OPTIONS, build_prompt
from benchmark.store import Benchmark, ensure_builtin, list_benchmarks
from benchmark.suites import anatomy, brain_mri, controls
from benchmark.validate import validate_benchmark


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Benchmark:
    return ensure_builtin(tmp_path_factory.mktemp("store"), "brain-mri", "small", 0, progress=False)


@pytest.fixture(scope="module")
def items(small):
    return small.items()


def test_small_is_valid_and_sized_as_specified(small, items):
    assert validate_benchmark(small.path) == []
    assert small.id.startswith("brain-mri-small-")
    assert 250 <= len(items) <= 320
    brain = items[~items["is_control"]]
    assert brain["subject_id"].nunique() == 8
    assert set(brain["sequence"]) == {"T1", "T2", "FLAIR"}
    assert set(brain["plane"]) == {"axial", "coronal", "sagittal"}
    assert set(brain["depth"]) == {0.5}
    assert set(brain["task"]) == {"sequence", "plane", "is_brain", "tumor_visible"}
    # every brain image is asked all four questions
    assert (brain.groupby("image_path")["task"].nunique() == 4).all()
    meta = small.meta
    assert (meta.suite, meta.size, meta.seed) == ("brain-mri", "small", 0)
    assert meta.item_count == len(items)


def test_same_seed_same_hash_other_seed_other_hash(small, tmp_path):
    again = ensure_builtin(tmp_path / "again", "brain-mri", "small", 0, progress=False)
    assert again.content_hash == small.content_hash
    assert again.id == small.id
    manifest_bytes = (small.path / fmt.MANIFEST_FILE).read_bytes()
    assert (again.path / fmt.MANIFEST_FILE).read_bytes() == manifest_bytes
    other = ensure_builtin(tmp_path / "again", "brain-mri", "small", 1, progress=False)
    assert other.content_hash != small.content_hash
    # ensure_builtin finds existing builds by suite, size and seed
    assert ensure_builtin(tmp_path / "again", "brain-mri", "small", 1).id == other.id
    assert len(list_benchmarks(tmp_path / "again")) == 2


def test_controls_are_flagged_and_only_asked_is_brain(items):
    ctrl = items[items["is_control"]]
    assert len(ctrl) >= 8
    assert set(ctrl["task"]) == {"is_brain"}
    assert set(ctrl["answer"]) == {"no"}
    assert ctrl["subject_id"].is_unique  # each control is its own subject
    assert ctrl["subject_id"].str.startswith("control-").all()
    assert (ctrl["tumor_voxels"] == -1).all()
    assert ctrl["depth"].isna().all()
    assert {"noise", "blank", "CT", "MR", "US"} <= set(ctrl["modality"])
    assert "brain" not in set(ctrl["anatomy"])
    brain = items[~items["is_control"]]
    assert set(brain.loc[brain["task"] == "is_brain", "answer"]) == {"yes"}
    assert (brain["tumor_voxels"] >= 0).all()


def test_prompts_options_and_answers_are_consistent(items):
    for row in items.itertuples():
        options = list(row.options)
        assert "UNSURE" in row.prompt and "Confidence" in row.prompt
        assert "Answer: <letter>\nConfidence: <0-100>" in row.prompt
        assert sorted(options) == sorted(TASK_OPTIONS[row.task])
        assert row.answer in options
        assert row.answer_letter == "ABCDEFG"[options.index(row.answer)]
        assert row.option_order == "|".join(options)
        lines = re.findall(r"^([A-G])\. (.+)$", row.prompt, flags=re.M)
        assert lines == [("ABCDEFG"[i], o) for i, o in enumerate(options)]
        assert row.prompt == build_prompt(row.task, options)


def test_option_order_varies_between_items(items):
    for task in ("sequence", "plane", "tumor_visible"):
        orders = items.loc[items["task"] == task, "option_order"]
        assert orders.nunique() > 1, task
    letters = items.loc[items["task"] == "sequence", "answer_letter"]
    assert letters.nunique() >= 4


def test_item_ids_name_their_variant(items):
    row = items[(items["task"] == "plane") & ~items["is_control"]].iloc[0]
    assert row["item_id"] == (
        f"{row['subject_id']}_{row['sequence']}_{row['plane']}_d050_plane_mc_neutral"
    )


def test_tumour_labels_follow_the_25_voxel_rule(items):
    tv = items[items["task"] == "tumor_visible"]
    assert ((tv["answer"] == "yes") == (tv["tumor_voxels"] >= brain_mri.TUMOR_MIN_VOXELS)).all()
    assert (tv["answer"] == "yes").sum() > 0 and (tv["answer"] == "no").sum() > 0
    plans = brain_mri.plan_subjects("small", 0)
    healthy = {f"sub-{p.index + 1:04d}" for p in plans if p.lesion_side is None}
    assert len(healthy) == 4
    assert (tv.loc[tv["subject_id"].isin(healthy), "tumor_voxels"] == 0).all()
    sides = {p.lesion_side for p in plans if p.lesion_side}
    assert sides == {"left", "right", "midline"}


def _decode(bench: Benchmark, path: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(bench.read_image(path))))


def test_labels_recomputed_from_the_materialised_volume(small, items):
    """For a tumour-bearing subject: rebuild the whole volume, find each slice from the brain's
    extent, count lesion voxels in that plane of the volume, and regenerate the stored image."""
    plan = next(p for p in brain_mri.plan_subjects("small", 0) if p.lesion_side == "midline")
    subject = brain_mri.subject_for("small", 0, plan.index)
    volume = anatomy.subject_volumes(subject)
    assert volume.lesion.shape == anatomy.load_atlas().grid_shape
    assert volume.lesion.any()
    assert not (volume.lesion & (volume.brain < 0.5)).any()  # lesion lies inside the brain mask

    inside = np.argwhere(volume.brain >= 0.5)
    rows = items[(items["subject_id"] == subject.subject_id) & (items["task"] == "tumor_visible")]
    assert len(rows) == 9
    for row in rows.itertuples():
        axis = anatomy.PLANE_AXIS[row.plane]
        lo, hi = inside[:, axis].min(), inside[:, axis].max()
        index = anatomy.slice_index(subject, row.plane, row.depth)
        assert abs(index - (lo + row.depth * (hi - lo))) <= 1.5

        count = int(anatomy.plane_view(volume.lesion, row.plane, index).sum())
        assert row.tumor_voxels == count
        assert row.answer == ("yes" if count >= 25 else "no")

        sample = anatomy.extract_slice(subject, row.plane, row.depth)
        clean = sample.render(row.sequence)
        from_volume = volume.render(subject, row.sequence)
        np.testing.assert_allclose(
            clean, anatomy.plane_view(from_volume, row.plane, index), rtol=1e-5, atol=1e-6
        )
        stored = _decode(small, row.image_path)
        assert stored.shape == (128, 128)
        np.testing.assert_array_equal(stored, brain_mri.slice_pixels(sample, row.sequence))
    # a midline lesion is cut by the mid-sagittal slice
    assert (rows["answer"] == "yes").sum() >= 3


def _tissue_means(sample: anatomy.SliceSample, image: np.ndarray) -> dict[str, float]:
    f = sample.fields
    pure = {
        "csf": (f.csf > 0.9),
        "gm": (f.gm > 0.9),
        "wm": (f.wm > 0.9),
    }
    out = {}
    for tissue, mask in pure.items():
        mask = mask & ~f.lesion & (f.core + f.rim + f.edema < 1e-3)
        assert mask.sum() > 50, tissue
        out[tissue] = float(image[mask].mean())
    return out


@pytest.mark.parametrize("plane", ["axial", "coronal"])
def test_tissue_contrast_per_sequence(plane):
    subject = brain_mri.subject_for("small", 0, 0)
    sample = anatomy.extract_slice(subject, plane, 0.5)
    for noisy in (False, True):
        means = {}
        for seq in ("T1", "T2", "FLAIR", "PD"):
            rng = brain_mri.noise_rng(subject, plane, 0.5, seq) if noisy else None
            means[seq] = _tissue_means(sample, sample.render(seq, rng))
        t1, t2, flair, pd_ = means["T1"], means["T2"], means["FLAIR"], means["PD"]
        assert t1["wm"] > t1["gm"] > t1["csf"]
        assert t2["csf"] > t2["gm"] > t2["wm"]
        assert flair["csf"] < flair["wm"] < flair["gm"]
        assert pd_["wm"] < min(pd_["gm"], pd_["csf"])
        assert abs(pd_["csf"] - pd_["gm"]) < 0.25 * pd_["gm"]  # flat


def test_lesion_is_bright_on_t2_and_flair_and_dark_core_on_t1():
    plan = next(p for p in brain_mri.plan_subjects("small", 0) if p.lesion_side == "left")
    subject = brain_mri.subject_for("small", 0, plan.index)
    sample = anatomy.extract_slice(subject, "axial", 0.5)
    f = sample.fields
    edema, core = f.edema > 0.9, f.core > 0.9
    assert edema.sum() > 20 and core.sum() > 5
    for seq in ("T2", "FLAIR"):
        image = sample.render(seq)
        assert image[edema].mean() > image[f.wm > 0.9].mean()
    t1 = sample.render("T1")
    assert t1[core].mean() < t1[f.gm > 0.9].mean()


def test_left_lesion_is_on_the_image_right_in_axial_slices():
    plan = next(p for p in brain_mri.plan_subjects("small", 0) if p.lesion_side == "left")
    subject = brain_mri.subject_for("small", 0, plan.index)
    mask = anatomy.extract_slice(subject, "axial", 0.5).fields.lesion
    columns = np.nonzero(mask)[1]
    assert columns.size and columns.mean() > mask.shape[1] / 2  # radiological convention


def test_subjects_differ_and_are_reproducible():
    a = brain_mri.subject_for("small", 0, 0)
    b = brain_mri.subject_for("small", 0, 1)
    assert not np.allclose(a.matrix, b.matrix)
    assert np.array_equal(a.matrix, brain_mri.subject_for("small", 0, 0).matrix)
    sa = anatomy.extract_slice(a, "axial", 0.5).render("T1")
    sb = anatomy.extract_slice(b, "axial", 0.5).render("T1")
    assert sa.shape == sb.shape and not np.allclose(sa, sb)


def test_paper_plan_matches_the_paper_design():
    plans = brain_mri.plan_subjects("paper", 0)
    spec = brain_mri.SIZES["paper"]
    assert len(plans) == 250
    assert sum(p.lesion_side is not None for p in plans) == 150
    assert all(len(p.sequences) == 2 for p in plans)
    assert {s for p in plans for s in p.sequences} == {"T1", "T2", "FLAIR", "PD"}
    assert len(spec.depths) * 3 * 2 * 250 == 4500
    assert spec.controls.count == 70
    assert {p.lesion_side for p in plans} == {None, "left", "right", "midline"}


def test_dicom_controls_show_non_head_metadata():
    import pydicom
    from pydicom.data import get_testdata_file

    for source in controls.DICOM_SOURCES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds = pydicom.dcmread(get_testdata_file(source.filename), stop_before_pixels=True)
        assert controls.non_brain_evidence(ds) is not None, source.filename
        assert str(ds.Modality) == source.modality
    # head studies in the same collection are recognised and never used
    for head in ("J2K_pixelrep_mismatch.dcm", "693_J2KI.dcm"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds = pydicom.dcmread(get_testdata_file(head), stop_before_pixels=True)
        assert controls.non_brain_evidence(ds) is None, head


def test_control_images_decode_at_the_common_size(small, items):
    for path in items.loc[items["is_control"], "image_path"]:
        assert _decode(small, path).shape == (128, 128)
    for path in items.loc[~items["is_control"], "image_path"].unique()[:10]:
        assert _decode(small, path).shape == (128, 128)
