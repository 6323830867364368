"""The built-in ``cube`` suite: its axes, its chains of items on shared images, and its labels
recomputed from the subjects' maps and the drawn box."""

from __future__ import annotations

import io
import json
import math
from collections import defaultdict

import numpy as np
import pytest
from PIL import Image

from benchmark import format as fmt
from benchmark.cli import main
from benchmark.importers.common import label_problems
from benchmark.store import write_benchmark
from benchmark.suites import anatomy, cube
from benchmark.validate import validate_manifest


@pytest.fixture(scope="module")
def built():
    return cube.build("small", seed=0, progress=False)


def test_axes_and_levels(built):
    manifest, images = built
    counts = cube.axis_counts(manifest)
    assert set(counts["task"]) == set(cube.QUESTIONS)
    assert set(counts["hierarchy"]) == {"low", "mid", "high"}
    assert set(counts["modality"]) == {"MR", "CT", "US"}
    assert {"brain", "chest", "heart", "abdomen"} <= set(counts["anatomy"])
    for task, level in (("modality", "low"), ("view", "low"), ("protocol", "low"),
                        ("organ", "mid"), ("region", "mid"), ("abnormality", "high"),
                        ("diagnosis", "high"), ("severity", "high")):  # fmt: skip
        assert set(manifest.loc[manifest.task == task, "hierarchy"]) == {level}
    assert validate_manifest(manifest, images) == []
    assert label_problems(manifest) == []


def test_every_item_has_four_distinct_options_and_asks_confidence(built):
    manifest, _ = built
    for row in manifest.to_dict(orient="records"):
        options = list(row["options"])
        assert len(options) == 4 == len(set(options))
        assert row["answer"] in options
        assert row["answer_letter"] == "ABCD"[options.index(row["answer"])]
        assert "UNSURE" in row["prompt"] and "Confidence: <0-100>" in row["prompt"]
        assert set(options) <= set(cube.ANSWER_SPACES[row["task"]])


def test_chains_give_credibility_pairs(built):
    manifest, _ = built
    levels = defaultdict(lambda: defaultdict(int))
    for path, level in zip(manifest["image_path"], manifest["hierarchy"], strict=True):
        levels[path][level] += 1
    brain = set(manifest.loc[manifest.anatomy == "brain", "image_path"])
    pairs = sum(levels[p]["high"] * (levels[p]["low"] + levels[p]["mid"]) for p in brain)
    assert all(levels[p]["high"] == 3 and levels[p]["low"] == 3 for p in brain)
    assert pairs == len(brain) * 3 * 5
    assert len(brain) >= 30


def _severity(voxels: int) -> str:
    if voxels < 25:
        return "no lesion"
    diameter = 2 * math.sqrt(voxels / math.pi)
    return "small (under 2 cm)" if diameter < 20 else (
        "medium (2 to 4 cm)" if diameter < 40 else "large (over 4 cm)")  # fmt: skip


def test_lesion_labels_follow_the_slice(built):
    manifest, _ = built
    answers = defaultdict(dict)
    for row in manifest[manifest.anatomy == "brain"].to_dict(orient="records"):
        answers[row["image_path"]][row["task"]] = (row["answer"], row["tumor_voxels"])
    seen = set()
    for by_task in answers.values():
        voxels = by_task["severity"][1]
        assert not 0 < voxels < 25  # ambiguous slices are left out
        visible = voxels >= 25
        assert by_task["abnormality"][0] == ("mass lesion" if visible else "no abnormality")
        assert by_task["diagnosis"][0] == ("glioma" if visible else "normal brain")
        assert by_task["severity"][0] == _severity(voxels)
        seen.add(by_task["severity"][0])
    assert seen == set(cube.ANSWER_SPACES["severity"])


def _red_box(png: bytes) -> tuple[int, int, int, int]:
    with Image.open(io.BytesIO(png)) as im:
        rgb = np.asarray(im.convert("RGB")).astype(int)
    red = (rgb[..., 0] == 255) & (rgb[..., 1] == 0) & (rgb[..., 2] == 0)
    rows, cols = np.nonzero(red)
    return int(rows.min()), int(rows.max()), int(cols.min()), int(cols.max())


def test_region_answer_is_what_the_drawn_box_holds(built):
    """Find the red box in the stored image, map it back onto the slice's tissue maps, and check
    that the answer is the class filling most of it."""
    manifest, images = built
    region = manifest[(manifest.task == "region") & (manifest.anatomy == "brain")]
    plans = {f"cube-sub-{p.index + 1:04d}": p for p in cube.plan_subjects("small", 0)}
    spec = cube.SIZES["small"]
    canvas = max(anatomy.load_atlas().grid_shape)
    scale = 128 / canvas
    checked = set()
    for row in region.to_dict(orient="records"):
        plan = plans[row["subject_id"]]
        subject = anatomy.make_subject(0, plan.index, sequences=plan.sequences,
                                       lesion_side=plan.side, lesion_class=plan.size_class,
                                       lesion_band=spec.lesion_band)  # fmt: skip
        fields = anatomy.extract_slice(subject, row["plane"], row["depth"]).fields
        assert int(fields.lesion.sum()) == row["tumor_voxels"]
        h, w = fields.lesion.shape
        top, left = (canvas - h) // 2, (canvas - w) // 2
        y0, y1, x0, x1 = _red_box(images[row["image_path"]])
        r0, r1 = math.ceil((y0 + 1) / scale - top), math.floor(y1 / scale - top)
        c0, c1 = math.ceil((x0 + 1) / scale - left), math.floor(x1 / scale - left)
        window = (slice(max(r0, 0), r1), slice(max(c0, 0), c1))
        lesion = fields.lesion[window].astype(float)
        shares = {
            "tumor": lesion.mean(),
            "cerebrospinal fluid": (fields.csf[window] * (1 - lesion)).mean(),
            "white matter": (fields.wm[window] * (1 - lesion)).mean(),
            "grey matter": (fields.gm[window] * (1 - lesion)).mean(),
        }
        assert max(shares, key=shares.get) == row["answer"], (row["item_id"], shares)
        checked.add(row["answer"])
    assert checked == set(cube.ANSWER_SPACES["region"])


def test_same_seed_same_hash_and_cli_build(built, tmp_path, capsys):
    manifest, images = built
    first = write_benchmark(tmp_path / "a", "cube-small", "cube", "small", 0, manifest, images)
    code = main(["benchmark", "build", "cube", "--size", "small", "--root", str(tmp_path / "b"),
                 "--no-progress"])  # fmt: skip
    assert code == 0
    fields = dict(line.split(None, 1) for line in capsys.readouterr().out.strip().splitlines())
    assert fields["hash"] == first.content_hash
    meta = json.loads((first.path / fmt.META_FILE).read_text())
    assert meta["suite"] == "cube" and meta["item_count"] == len(manifest)
