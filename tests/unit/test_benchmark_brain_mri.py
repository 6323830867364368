"""The brain-mri suite, built for real at sizes ``small`` and ``small-full``; labels checked by
recomputation from the masks and the subjects' geometry."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
from PIL import Image

from benchmark import format as fmt
from benchmark.prompts import PHRASINGS, TASK_OPTIONS, build_prompt
from benchmark.store import Benchmark, ensure_builtin, list_benchmarks
from benchmark.suites import anatomy, brain_mri
from benchmark.suites.items import HIERARCHY_OF, option_order
from benchmark.validate import validate_benchmark


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Benchmark:
    return ensure_builtin(tmp_path_factory.mktemp("store"), "brain-mri", "small", 0, progress=False)


@pytest.fixture(scope="module")
def items(small):
    return small.items()


@pytest.fixture(scope="module")
def full(tmp_path_factory) -> Benchmark:
    root = tmp_path_factory.mktemp("store-full")
    return ensure_builtin(root, "brain-mri", "small-full", 0, progress=False)


@pytest.fixture(scope="module")
def full_items(full):
    return full.items()


def _decode(bench: Benchmark, path: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(bench.read_image(path))))


# --- size, identity, splits -----------------------------------------------------------------


def test_small_is_valid_and_sized_as_specified(small, items):
    assert validate_benchmark(small.path) == []
    assert small.id.startswith("brain-mri-small-")
    assert small.meta.format_version == fmt.FORMAT_VERSION
    brain = items[~items["is_control"]]
    ctrl = items[items["is_control"]]
    assert brain["subject_id"].nunique() == 12
    assert brain["image_path"].nunique() == 12 * 3 * 2  # 3 planes x 1 depth x 2 sequences
    assert ctrl["image_path"].nunique() == brain_mri.SIZES["small"].controls.count == 13
    assert len(items) == 72 * 5 + 13 * 2 == 386
    audit = items[items["split"] == "audit"]  # what a run replays
    assert len(audit) == 8 * 6 * 5 + 13 * 2 == 266
    assert set(audit["sequence"]) - {""} == set(brain_mri.SEQUENCES)
    assert set(audit.loc[audit["task"] == "laterality", "answer"]) == {
        "left", "right", "bilateral", "none"
    }  # fmt: skip
    assert set(brain["sequence"]) == set(brain_mri.SEQUENCES) == {"T1", "T1ce", "T2", "FLAIR", "PD"}
    assert set(brain["plane"]) == {"axial", "coronal", "sagittal"}
    assert set(brain["depth"]) == {0.5}
    assert set(brain["task"]) == set(brain_mri.BRAIN_TASKS)
    assert (brain.groupby("image_path")["task"].nunique() == 5).all()
    assert set(items["format"]) == {"mc"} and set(items["phrasing"]) == {"neutral"}
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


def test_the_split_is_by_subject_and_stratified(items, full_items):
    per_subject = full_items.groupby("subject_id")["split"].nunique()
    assert (per_subject == 1).all()
    assert set(full_items.loc[full_items["is_control"], "split"]) == {"audit"}
    plans = brain_mri.plan_subjects("small", 0)
    full_plans = brain_mri.plan_subjects("small-full", 0)
    assert [(p.sequences, p.lesion_side, p.split) for p in plans] == [
        (p.sequences, p.lesion_side, p.split) for p in full_plans
    ]
    train = [p for p in plans if p.split == "train"]
    assert len(train) == 4
    assert sum(p.lesion_side is None for p in train) == 2  # two healthy, two with a tumour
    for frame in (items, full_items):
        for plan in plans:
            rows = frame[frame["subject_id"] == plan.subject_id]
            assert set(rows["split"]) == {plan.split}
    # the same subjects and images as small: only the items differ
    assert set(full_items["image_path"]) == set(items["image_path"])


# --- items, options, prompts ----------------------------------------------------------------


def test_mc_prompts_options_and_answers_are_consistent(items):
    for row in items.itertuples():
        options = list(row.options)
        assert "UNSURE" in row.prompt and "Confidence" in row.prompt
        assert "Answer: <letter>\nConfidence: <0-100>" in row.prompt
        assert sorted(options) == sorted(TASK_OPTIONS[row.task])
        if row.expect_abstain:
            assert (row.answer, row.answer_letter) == ("UNSURE", "")
        else:
            assert row.answer in options
            assert row.answer_letter == "ABCDEFG"[options.index(row.answer)]
        assert row.option_order == "|".join(options)
        lines = re.findall(r"^([A-G])\. (.+)$", row.prompt, flags=re.M)
        assert lines == [("ABCDEFG"[i], o) for i, o in enumerate(options)]
        assert row.prompt == build_prompt(row.task, options)
        assert row.hierarchy == HIERARCHY_OF[row.task]


def test_option_order_is_recorded_reproducible_and_varied(items, full_items):
    for frame in (items, full_items):
        mc = frame[frame["format"] == "mc"]
        for row in mc.itertuples():
            assert list(row.options) == option_order(0, row.item_id, TASK_OPTIONS[row.task])
    for task in ("sequence", "plane", "tumor_visible", "laterality"):
        orders = items.loc[items["task"] == task, "option_order"]
        assert orders.nunique() > 1, task
    assert items.loc[items["task"] == "sequence", "answer_letter"].nunique() >= 4
    # another seed shuffles differently
    row = items.iloc[0]
    other = [option_order(s, row["item_id"], TASK_OPTIONS[row["task"]]) for s in range(1, 6)]
    assert any(o != list(row["options"]) for o in other)


def test_item_ids_name_their_variant(items, full_items):
    row = items[(items["task"] == "plane") & ~items["is_control"]].iloc[0]
    assert row["item_id"] == (
        f"{row['subject_id']}_{row['sequence']}_{row['plane']}_d050_plane_mc_neutral"
    )
    for row in full_items.sample(50, random_state=0).itertuples():
        assert row.item_id.endswith(f"_{row.task}_{row.format}_{row.phrasing}")


def test_small_full_asks_every_task_in_both_formats_and_three_phrasings(full, full_items):
    assert validate_benchmark(full.path) == []
    assert len(full_items) == 386 * 2 * 3
    counts = full_items.groupby(["image_path", "task"]).size()
    assert set(counts) == {6}  # 2 formats x 3 phrasings
    assert set(full_items["phrasing"]) == set(PHRASINGS)
    prompts = full_items.groupby(["task", "format"])["prompt"].nunique()
    for task in (*brain_mri.BRAIN_TASKS, "abstention"):
        assert prompts[(task, "open")] == 3, task  # three distinct phrasings


def test_open_items_record_the_answer_space_and_ask_for_findings(full_items):
    open_items = full_items[full_items["format"] == "open"]
    assert len(open_items) == len(full_items) // 2
    for row in open_items.itertuples():
        assert list(row.options) == list(TASK_OPTIONS[row.task])
        assert (row.answer_letter, row.option_order) == ("", "")
        assert row.answer in row.options or (row.expect_abstain and row.answer == "UNSURE")
        assert row.prompt.endswith(
            "Answer: <your answer>\nConfidence: <0-100>\nFindings: <what you see>"
        )
        assert "UNSURE" in row.prompt and "0 to 100" in row.prompt
        assert not re.search(r"^[A-G]\. ", row.prompt, flags=re.M)  # no lettered options
        assert row.prompt == build_prompt(row.task, [], phrasing=row.phrasing, item_format="open")


def test_every_phrasing_asks_for_answer_confidence_and_unsure():
    for task in TASK_OPTIONS:
        for phrasing in PHRASINGS:
            for item_format in ("mc", "open"):
                prompt = build_prompt(
                    task, TASK_OPTIONS[task], phrasing=phrasing, item_format=item_format
                )
                assert "Answer: <" in prompt and "Confidence: <0-100>" in prompt
                assert "UNSURE" in prompt and "from 0 to 100" in prompt
    for task in ("laterality", "abstention"):  # the side asked is the patient's
        assert "patient" in build_prompt(task, [], phrasing="neutral", item_format="open")


# --- controls -------------------------------------------------------------------------------


def test_controls_are_flagged_and_asked_is_brain_and_abstention(items):
    ctrl = items[items["is_control"]]
    assert set(ctrl["task"]) == {"is_brain", "abstention"}
    assert ctrl["subject_id"].str.startswith("control-").all()
    assert (ctrl.groupby("subject_id")["image_path"].nunique() == 1).all()  # own subject each
    assert (ctrl["tumor_voxels"] == -1).all()
    assert set(ctrl["laterality"]) == {""} and set(ctrl["split"]) == {"audit"}
    assert all(len(f) == 0 for f in ctrl["supported_findings"])
    assert {"noise", "blank", "CT", "MR", "US"} <= set(ctrl["modality"])
    abstain = ctrl[ctrl["task"] == "abstention"]
    assert abstain["expect_abstain"].all() and set(abstain["answer"]) == {"UNSURE"}
    assert set(abstain["answer_letter"]) == {""} and set(abstain["hierarchy"]) == {""}
    assert not items.loc[items["task"] != "abstention", "expect_abstain"].any()
    # is_brain: "no" for everything but a corrupted MRI, which still shows a brain
    is_brain = ctrl[ctrl["task"] == "is_brain"].set_index("dataset")["answer"]
    assert set(is_brain.drop("mni152-synthetic-corrupted")) == {"no"}
    assert set(is_brain.loc["mni152-synthetic-corrupted"]) == {"yes"}
    corrupted = ctrl[ctrl["dataset"] == "mni152-synthetic-corrupted"]
    assert corrupted["subject_id"].str.startswith("control-corrupt-").all()
    assert set(corrupted["anatomy"]) == {"brain"} and corrupted["depth"].notna().all()
    non_mri = ctrl[ctrl["dataset"] != "mni152-synthetic-corrupted"]
    assert non_mri["depth"].isna().all() and "brain" not in set(non_mri["anatomy"])
    brain = items[~items["is_control"]]
    assert set(brain.loc[brain["task"] == "is_brain", "answer"]) == {"yes"}
    assert (brain["tumor_voxels"] >= 0).all()


def test_control_images_decode_at_the_common_size(small, items):
    for path in items.loc[items["is_control"], "image_path"]:
        assert _decode(small, path).shape == (128, 128)
    for path in items.loc[~items["is_control"], "image_path"].unique()[:10]:
        assert _decode(small, path).shape == (128, 128)


def test_dicom_controls_show_non_head_metadata():
    import warnings

    import pydicom
    from pydicom.data import get_testdata_file

    from benchmark.suites import controls

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


# --- labels, recomputed ---------------------------------------------------------------------


def test_tumour_labels_follow_the_25_voxel_rule(items):
    tv = items[items["task"] == "tumor_visible"]
    assert ((tv["answer"] == "yes") == (tv["tumor_voxels"] >= 25)).all()
    assert brain_mri.TUMOR_MIN_VOXELS == 25
    assert (tv["answer"] == "yes").sum() > 0 and (tv["answer"] == "no").sum() > 0
    plans = brain_mri.plan_subjects("small", 0)
    healthy = {p.subject_id for p in plans if p.lesion_side is None}
    assert len(healthy) == 6
    assert (tv.loc[tv["subject_id"].isin(healthy), "tumor_voxels"] == 0).all()
    assert {p.lesion_side for p in plans if p.lesion_side} == {"left", "right", "midline"}


def _independent_lateral(subject: anatomy.Subject, plane: str, index: int) -> np.ndarray:
    """Signed distance (mm) of each voxel of a display-oriented slice from the mid-sagittal
    plane, from the subject's affine and the MNI template's own affine (x = 0)."""
    from nilearn import datasets

    affine = datasets.load_mni152_gm_template(resolution=1).affine
    midline = -affine[0, 3] / affine[0, 0]  # atlas voxel index of MNI x = 0
    shape = anatomy.load_atlas().grid_shape
    grids = np.meshgrid(*(np.arange(n, dtype=np.float64) for n in shape), indexing="ij")
    axis = anatomy.PLANE_AXIS[plane]
    coords = np.stack([np.take(g, index, axis=axis) for g in grids])  # raw slice orientation
    atlas_x = np.tensordot(subject.matrix[0], coords, axes=1) + subject.offset[0]
    return (atlas_x - midline)[::-1, ::-1].T  # the display orientation of plane_view


def _expected_laterality(mask: np.ndarray, lateral: np.ndarray, plane: str) -> str:
    if mask.sum() < 25:
        return "none"
    x = lateral[mask]
    if plane == "sagittal":  # the slice's own side where it cuts the lesion
        return "right" if x.mean() > 0 else "left"
    if (x < 0).sum() >= 25 and (x > 0).sum() >= 25:
        return "bilateral"
    return "right" if x.mean() > 0 else "left"


def test_laterality_and_findings_recomputed_for_every_tumour_slice(items):
    lat = items[(items["task"] == "laterality") & ~items["is_control"]]
    plans = {p.subject_id: p for p in brain_mri.plan_subjects("small", 0)}
    seen = set()
    for row in lat.itertuples():
        plan = plans[row.subject_id]
        if plan.lesion_side is None:
            assert row.answer == "none" and len(row.supported_findings) == 0
            continue
        subject = brain_mri.subject_for("small", 0, plan.index)
        sample = anatomy.extract_slice(subject, row.plane, row.depth)
        lateral = _independent_lateral(subject, row.plane, sample.index)
        np.testing.assert_allclose(sample.fields.lateral, lateral, atol=1e-3)
        mask = sample.fields.lesion
        assert int(mask.sum()) == row.tumor_voxels
        expected = _expected_laterality(mask, lateral, row.plane)
        assert row.answer == row.laterality == expected, row.item_id
        seen.add(expected)
        findings = set(row.supported_findings)
        if expected == "none":
            assert findings == set()
        else:
            assert {"tumor", "lesion", "edema", "enhancement"} <= findings
            sides = {f.removeprefix("laterality_") for f in findings if f.startswith("laterality")}
            assert sides == ({"left", "right", "bilateral"} if expected == "bilateral" else
                             {expected})  # fmt: skip
            has_core = bool((mask & (sample.fields.core >= 0.5)).any())
            assert ("necrosis" in findings) == has_core
            assert "mass_effect" not in findings
        assert findings <= set(fmt.FINDINGS)
    assert {"left", "right", "bilateral", "none"} <= seen
    # every item of an image carries the image's findings and laterality
    per_image = items[~items["is_control"]].groupby("image_path")
    assert (per_image["laterality"].nunique() == 1).all()


def test_left_lesion_is_on_the_image_right_and_labelled_left():
    plan = next(p for p in brain_mri.plan_subjects("small", 0) if p.lesion_side == "left")
    subject = brain_mri.subject_for("small", 0, plan.index)
    sample = anatomy.extract_slice(subject, "axial", 0.5)
    columns = np.nonzero(sample.fields.lesion)[1]
    assert columns.size and columns.mean() > sample.fields.lesion.shape[1] / 2  # radiological
    assert brain_mri.labels_of(sample).laterality in ("left", "bilateral")


def test_sagittal_slices_take_their_own_side():
    plan = next(p for p in brain_mri.plan_subjects("small", 0) if p.lesion_side == "left")
    subject = brain_mri.subject_for("small", 0, plan.index)
    lo, hi = subject.extent[0]
    # sweep sagittal slices across the lesion: left of the midline "left", right of it "right"
    found = {}
    for depth in np.linspace(0.05, 0.95, 37):
        sample = anatomy.extract_slice(subject, "sagittal", float(depth))
        labels = brain_mri.labels_of(sample)
        if labels.tumor_visible:
            side = "right" if sample.fields.lateral[sample.fields.lesion].mean() > 0 else "left"
            assert labels.laterality == side
            found[float(depth)] = side
    assert "left" in found.values()
    assert all(side != "bilateral" for side in found.values())
    assert lo < hi


def test_labels_recomputed_from_the_materialised_volume(small, items):
    """For the midline tumour subject: rebuild the whole volume, find each slice from the brain's
    extent, count lesion voxels in that plane of the volume, and regenerate the stored image."""
    plan = next(p for p in brain_mri.plan_subjects("small", 0) if p.lesion_side == "midline")
    subject = brain_mri.subject_for("small", 0, plan.index)
    volume = anatomy.subject_volumes(subject)
    assert volume.lesion.shape == anatomy.load_atlas().grid_shape
    assert volume.lesion.any()
    assert not (volume.lesion & (volume.brain < 0.5)).any()  # lesion lies inside the brain mask

    inside = np.argwhere(volume.brain >= 0.5)
    rows = items[(items["subject_id"] == subject.subject_id) & (items["task"] == "tumor_visible")]
    assert len(rows) == 6  # 3 planes x 2 sequences
    for row in rows.itertuples():
        axis = anatomy.PLANE_AXIS[row.plane]
        lo, hi = inside[:, axis].min(), inside[:, axis].max()
        index = anatomy.slice_index(subject, row.plane, row.depth)
        assert abs(index - (lo + row.depth * (hi - lo))) <= 1.5

        mask = anatomy.plane_view(volume.lesion, row.plane, index)
        assert row.tumor_voxels == int(mask.sum())
        assert row.answer == ("yes" if mask.sum() >= 25 else "no")
        lateral = anatomy.plane_view(volume.lateral, row.plane, index)
        lat_row = items[(items["image_path"] == row.image_path) & (items["task"] == "laterality")]
        assert lat_row["answer"].item() == _expected_laterality(mask, lateral, row.plane)

        sample = anatomy.extract_slice(subject, row.plane, row.depth)
        clean = sample.render(row.sequence)
        from_volume = volume.render(subject, row.sequence)
        np.testing.assert_allclose(
            clean, anatomy.plane_view(from_volume, row.plane, index), rtol=1e-5, atol=1e-6
        )
        stored = _decode(small, row.image_path)
        assert stored.shape == (128, 128)
        np.testing.assert_array_equal(stored, brain_mri.slice_pixels(sample, row.sequence))
        assert row.sequence in plan.sequences  # sequence label from the subject's metadata
    assert (rows["answer"] == "yes").sum() >= 2  # a midline lesion is cut by central slices


def test_sequence_labels_follow_the_subject_plan(items):
    brain = items[~items["is_control"] & (items["task"] == "sequence")]
    plans = {p.subject_id: p for p in brain_mri.plan_subjects("small", 0)}
    for row in brain.itertuples():
        plan = plans[row.subject_id]
        position = brain_mri.positions("small").index((row.plane, row.depth))
        assert row.answer == row.sequence
        assert row.sequence in plan.sequences_at(position)


# --- contrast -------------------------------------------------------------------------------


def _tissue_means(sample: anatomy.SliceSample, image: np.ndarray) -> dict[str, float]:
    f = sample.fields
    pure = {"csf": (f.csf > 0.9), "gm": (f.gm > 0.9), "wm": (f.wm > 0.9)}
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
        for seq in brain_mri.SEQUENCES:
            rng = brain_mri.noise_rng(subject, plane, 0.5, seq) if noisy else None
            means[seq] = _tissue_means(sample, sample.render(seq, rng))
        t1, t1ce, t2 = means["T1"], means["T1ce"], means["T2"]
        flair, pd_ = means["FLAIR"], means["PD"]
        assert t1["wm"] > t1["gm"] > t1["csf"]  # CSF dark on T1
        assert t1ce["wm"] > t1ce["gm"] > t1ce["csf"]
        assert t2["csf"] > t2["gm"] > t2["wm"]  # CSF bright on T2
        assert flair["csf"] < flair["wm"] < flair["gm"]  # CSF suppressed on FLAIR
        assert pd_["wm"] < min(pd_["gm"], pd_["csf"])
        assert abs(pd_["csf"] - pd_["gm"]) < 0.25 * pd_["gm"]  # flat


def test_lesion_contrast_and_t1ce_rim_enhancement():
    plan = next(p for p in brain_mri.plan_subjects("small", 0) if p.lesion_side == "left")
    subject = brain_mri.subject_for("small", 0, plan.index)
    sample = anatomy.extract_slice(subject, "axial", 0.5)
    f = sample.fields
    edema, core, rim, wm = f.edema > 0.9, f.core > 0.9, f.rim > 0.9, f.wm > 0.9
    assert edema.sum() > 20 and core.sum() > 5 and rim.sum() > 20
    for seq in ("T2", "FLAIR"):
        image = sample.render(seq)
        assert image[edema].mean() > image[wm].mean()  # oedema bright
    t1 = sample.render("T1")
    assert t1[core].mean() < t1[f.gm > 0.9].mean()  # necrotic core dark on T1
    assert t1[rim].mean() < t1[wm].mean()  # no enhancement before contrast
    rng = brain_mri.noise_rng(subject, "axial", 0.5, "T1ce")
    t1ce = sample.render("T1ce", rng)
    assert t1ce[rim].mean() > 1.3 * t1ce[wm].mean()  # the rim enhances: brightest tissue
    assert t1ce[rim].mean() > max(t1ce[core].mean(), t1ce[edema].mean(), t1ce[f.gm > 0.9].mean())
    assert t1ce[core].mean() < t1ce[wm].mean()  # the core does not
    # and it survives into the stored 8-bit image
    from benchmark.suites.imaging import pad_square, resize

    canvas = max(anatomy.load_atlas().grid_shape)
    image = brain_mri.slice_pixels(sample, "T1ce").astype(float)

    def stored_mask(mask: np.ndarray) -> np.ndarray:
        return resize(pad_square(mask.astype(np.uint8) * 255, canvas)) > 230

    assert image[stored_mask(rim)].mean() > image[stored_mask(wm)].mean() + 20


def test_subjects_differ_and_are_reproducible():
    a = brain_mri.subject_for("small", 0, 0)
    b = brain_mri.subject_for("small", 0, 1)
    assert not np.allclose(a.matrix, b.matrix)
    assert np.array_equal(a.matrix, brain_mri.subject_for("small", 0, 0).matrix)
    sa = anatomy.extract_slice(a, "axial", 0.5).render("T1")
    sb = anatomy.extract_slice(b, "axial", 0.5).render("T1")
    assert sa.shape == sb.shape and not np.allclose(sa, sb)


# --- corrupted controls ---------------------------------------------------------------------


def test_corruptions_ruin_a_brain_slice_in_their_own_way():
    from benchmark.suites.controls import corrupt

    source = brain_mri.corrupted_sources("small", 0)[0].values
    background = source < 1e-3
    assert background.mean() > 0.2
    energy = float(np.abs(np.diff(source, axis=0)).mean())
    blurred = corrupt(source, "blur", np.random.default_rng(0))
    assert float(np.abs(np.diff(blurred, axis=0)).mean()) < 0.3 * energy  # edges wiped out
    ghosted = corrupt(source, "ghosting", np.random.default_rng(0))
    assert ghosted[background].mean() > 10 * max(source[background].mean(), 1e-4)  # ghosts
    spiked = corrupt(source, "spike", np.random.default_rng(0))
    spectrum = np.abs(np.fft.fft2(spiked - source))
    assert spectrum.max() > 0.5 * np.abs(source).sum()  # one dominant stripe frequency
    assert spiked[background].mean() > 0.2 * source[~background].mean()  # stripes everywhere
    with pytest.raises(ValueError, match="unknown corruption"):
        corrupt(source, "zipper", np.random.default_rng(0))


# --- paper ----------------------------------------------------------------------------------


def test_paper_plan_matches_the_paper_design():
    plans = brain_mri.plan_subjects("paper", 0)
    spec = brain_mri.SIZES["paper"]
    assert len(plans) == 250
    tumour = [p for p in plans if p.lesion_side is not None]
    healthy = [p for p in plans if p.lesion_side is None]
    assert len(tumour) == 150
    positions = brain_mri.positions("paper")
    assert len(positions) == 9
    slices = sum(len(p.sequences_at(i)) for p in plans for i in range(len(positions)))
    assert slices == 150 * 9 + 100 * 27 == 4050
    assert spec.controls.count == 85 >= 70
    assert {s for p in plans for s in p.sequences} == set(brain_mri.SEQUENCES)
    assert {p.lesion_side for p in plans} == {None, "left", "right", "midline"}
    assert {p.lesion_class for p in tumour} == {"small", "medium", "large"}
    assert sum(p.split == "train" for p in tumour) == 30
    assert sum(p.split == "train" for p in healthy) == 20
    assert sum(p.extra_phrasings for p in plans) == 50
    assert plans == brain_mri.plan_subjects("paper", 0)
    assert plans != brain_mri.plan_subjects("paper", 1)
