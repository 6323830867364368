"""MedRCube's released format: import, export, the round trip, and malformed releases."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from benchmark import format as fmt
from benchmark import medrcube
from benchmark.cli import main
from benchmark.errors import BenchmarkInvalid
from benchmark.importers import run_import


def _png(level: int, rgb: bool = False) -> bytes:
    pixels = np.full((32, 40), level, dtype=np.uint8)
    pixels[4:12, 6:20] = 255 - level
    image = Image.fromarray(pixels)
    if rgb:
        image = image.convert("RGB")
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def _jpeg(level: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((16, 16, 3), level, dtype=np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()


def _item(item_id, question, options, answer, image, task, modality, parts, dataset, **extra):
    item = {"id": item_id, "question": question}
    item.update({f"option_{'ABCD'[i]}": o for i, o in enumerate(options)})
    item.update(
        {
            "gt_answer": answer,
            "image_path": image,
            "task": task,
            "modality": modality,
            "parts": parts,
            "dataset": dataset,
        }  # fmt: skip
    )
    item.update(extra)
    return item


def write_release(root) -> dict[str, list]:
    """A small MedRCube-format tree: two datasets, a shared image with a low- and high-level
    chain, a JPEG, a missing (restricted) image, an extra field and non-ASCII text."""
    brats = root / "Brain" / "BraTS2020"
    (brats / "pictures").mkdir(parents=True)
    (brats / "pictures" / "case1.png").write_bytes(_png(40))
    (brats / "pictures" / "case2.jpg").write_bytes(_jpeg(90))
    nih = root / "NIH"
    (nih / "img").mkdir(parents=True)
    (nih / "img" / "00001.png").write_bytes(_png(120, rgb=True))
    files = {
        "Brain/BraTS2020/test.json": [
            _item("b-1", "Which imaging modality is shown?", ["CT", "MRI", "X-Ray", "Ultrasound"],
                  "MRI", "pictures/case1.png", "Modality Recognition", "MRI", "Brain",
                  "BraTS 2020"),
            _item("b-2", "Which sequence was used?", ["T1", "T2", "FLAIR", "T1CE"], "FLAIR",
                  "pictures/case1.png", "Imaging Protocols Recognition", "MRI", "Brain",
                  "BraTS 2020", difficulty=2),
            _item("b-3", "What is the diagnosis?", ["Glioma", "Meningioma", "Metastasis",
                  "Abscess"], "Glioma", "pictures/case1.png", "Disease Diagnosis", "MRI",
                  "Brain", "BraTS 2020", note="résumé – ünïcode"),
            _item("b-4", "Which plane is this?", ["Axial", "Coronal", "Sagittal", "Oblique"],
                  "Axial", "pictures/case2.jpg", "View Recognition", "MRI", "Brain",
                  "BraTS 2020"),
        ],
        "NIH/test.json": [
            _item(17, "Is there an abnormality?", ["Pneumothorax", "No finding", "Mass"],
                  "No finding", "img/00001.png", "Abnormity Diagnosis", "X-Ray", "Chest",
                  "NIH Chest X-ray"),
            _item("n-2", "Which organ is in the red box?", ["Heart", "Lung", "Liver", "Spine"],
                  "Heart", "img/restricted.png", "Organ Recognition", "X-Ray", "Chest",
                  "NIH Chest X-ray"),
        ],
    }  # fmt: skip
    for rel, items in files.items():
        (root / rel).write_bytes(medrcube.dump_items(items))
    return files


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    root = tmp_path_factory.mktemp("medrcube")
    return root, write_release(root)


@pytest.fixture(scope="module")
def imported(release, tmp_path_factory):
    store = tmp_path_factory.mktemp("store")
    return run_import("medrcube", release[0], store, name="medrcube-test")


def test_import_maps_fields_and_flags_missing_images(imported):
    items = imported.items().set_index("item_id")
    assert len(items) == 6
    assert items.loc["Brain/BraTS2020/b-1", "task"] == "modality"
    assert items.loc["Brain/BraTS2020/b-1", "hierarchy"] == "low"
    assert items.loc["Brain/BraTS2020/b-2", "task"] == "protocol"
    assert items.loc["Brain/BraTS2020/b-3", "hierarchy"] == "high"
    assert items.loc["NIH/17", "task"] == "abnormality"
    assert items.loc["NIH/n-2", "hierarchy"] == "mid"
    assert items.loc["NIH/17", "modality"] == "XR" and items.loc["NIH/17", "anatomy"] == "chest"
    missing = items.loc["NIH/n-2"]
    assert bool(missing["image_missing"]) and missing["image_path"] == ""
    assert missing["media_type"] == ""
    assert not items.drop(index="NIH/n-2")["image_missing"].any()
    # The three BraTS items on case1.png share one stored image: the credibility pairs.
    case1 = items.loc[["Brain/BraTS2020/b-1", "Brain/BraTS2020/b-2", "Brain/BraTS2020/b-3"]]
    assert case1["image_path"].nunique() == 1
    row = items.loc["Brain/BraTS2020/b-2"]
    assert list(row["options"]) == ["T1", "T2", "FLAIR", "T1CE"]
    assert row["answer_letter"] == "C"
    assert "Which sequence was used?" in row["prompt"] and "UNSURE" in row["prompt"]
    assert "Confidence" in row["prompt"]
    assert imported.read_image(row["image_path"]) == _png(40)  # a PNG is stored unchanged
    with Image.open(io.BytesIO(imported.read_image(items.loc["Brain/BraTS2020/b-4",
                                                              "image_path"]))) as im:  # fmt: skip
        assert im.format == "PNG"


def test_round_trip_is_byte_identical(release, imported, tmp_path):
    root, files = release
    out = tmp_path / "export"
    summary = medrcube.export(imported, out)
    assert summary.items == 6 and summary.files == 2
    for rel in files:
        assert (out / rel).read_bytes() == (root / rel).read_bytes(), rel
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert written == [
        "Brain/BraTS2020/pictures/case1.png",
        "Brain/BraTS2020/pictures/case2.jpg",
        "Brain/BraTS2020/test.json",
        "NIH/img/00001.png",
        "NIH/test.json",
    ]
    # PNG images come back byte for byte; the JPEG is re-encoded as JPEG.
    for rel in ("Brain/BraTS2020/pictures/case1.png", "NIH/img/00001.png"):
        assert (out / rel).read_bytes() == (root / rel).read_bytes()
    with Image.open(out / "Brain/BraTS2020/pictures/case2.jpg") as im:
        assert im.format == "JPEG" and im.size == (16, 16)
    # And the export imports to the same benchmark.
    again = run_import("medrcube", out, tmp_path / "store2", name="medrcube-test")
    assert again.content_hash == imported.content_hash


def test_export_of_a_suite_benchmark_is_medrcube_format(tmp_path):
    from benchmark.importers.common import Collected, frame_from_rows
    from benchmark.store import write_benchmark
    from benchmark.suites.cube import cube_item

    collected = Collected()
    path = collected.add_image(_png(10))
    base = {"subject_id": "s1", "image_path": path, "media_type": "image/png", "modality": "MR",
            "anatomy": "brain", "dataset": "synthetic brain"}  # fmt: skip
    rows = [
        cube_item(0, "img1_modality", "modality", "MRI", base),
        cube_item(0, "img1_severity", "severity", "small (under 2 cm)", base),
    ]
    bench = write_benchmark(tmp_path / "store", "mini", "cube", "small", 0,
                            frame_from_rows(rows), collected.images)  # fmt: skip
    out = tmp_path / "out"
    medrcube.export(bench, out)
    items = json.loads((out / "synthetic-brain" / "test.json").read_text())
    assert [i["id"] for i in items] == ["img1_modality", "img1_severity"]
    first = items[0]
    assert first["question"] == "Which imaging modality produced this image?"
    assert first["task"] == "Modality Recognition" and first["modality"] == "MRI"
    assert first["parts"] == "Brain"
    assert first["gt_answer"] == first[f"option_{rows[0]['answer_letter']}"]
    assert (out / "synthetic-brain" / first["image_path"]).read_bytes() == collected.images[path]
    assert items[1]["task"] == "Severity Grading"
    # The exported tree imports again, with the same levels.
    back = run_import("medrcube", out, tmp_path / "store2").items()
    assert sorted(back["hierarchy"]) == ["high", "low"]
    with pytest.raises(BenchmarkInvalid, match="not an empty folder"):
        medrcube.export(bench, out)


def test_malformed_release_names_every_item(tmp_path):
    root = tmp_path / "bad"
    good = root / "A"
    good.mkdir(parents=True)
    (good / "x.png").write_bytes(_png(5))
    (good / "broken.png").write_bytes(b"\x89PNG not really")
    items = [
        _item("1", "Q?", ["a", "b", "c", "d"], "e", "x.png", "Disease Diagnosis", "CT", "Chest",
              "A"),
        _item("2", "Q?", ["a", "a", "c", "d"], "a", "x.png", "Disease Diagnosis", "CT", "Chest",
              "A"),
        _item("3", "Q?", ["a", "b", "c", "d"], "a", "../../etc/passwd", "Disease Diagnosis",
              "CT", "Chest", "A"),
        _item("4", "Q?", ["a", "b", "c", "d"], "a", "broken.png", "Disease Diagnosis", "CT",
              "Chest", "A"),
        {"id": "5", "question": "Q?", "option_A": "a", "option_B": "b", "gt_answer": "a"},
        _item("1", "Q?", ["a", "b", "c", "d"], "a", "x.png", "Disease Diagnosis", "CT", "Chest",
              "A"),
        "not an object",
    ]  # fmt: skip
    (good / "test.json").write_bytes(medrcube.dump_items(items))
    (root / "B").mkdir()
    (root / "B" / "test.json").write_text("[{,]")
    (root / "C").mkdir()
    (root / "C" / "test.json").write_text('{"id": 1}')
    store = tmp_path / "store"
    with pytest.raises(BenchmarkInvalid) as err:
        run_import("medrcube", root, store)
    text = "\n".join(err.value.problems)
    where = f"{good / 'test.json'}: item"
    assert f"{where} #0 (id '1'): gt_answer 'e' matches 0 options" in text
    assert f"{where} #1 (id '2'): gt_answer 'a' matches 2 options" in text
    assert f"{where} #1 (id '2'): duplicated options ['a']" in text
    assert f"{where} #2 (id '3'): image_path '../../etc/passwd' contains '..'" in text
    assert f"{where} #3 (id '4'): image 'broken.png' does not decode" in text
    assert f"{where} #4 (id '5'): missing field 'task'" in text
    assert f"{where} #5 (id '1'): duplicate id (also item #0)" in text
    assert f"{where} #6: expected an object, got str" in text
    assert f"{root / 'B' / 'test.json'}: bad JSON" in text
    assert f"{root / 'C' / 'test.json'}: expected a JSON list of items, got dict" in text
    assert not store.exists() or not any(store.iterdir())


def test_cli_import_and_export(release, tmp_path, capsys):
    root, files = release
    store = tmp_path / "store"
    code = main(["benchmark", "import", "medrcube", str(root), "--name", "cube-release",
                 "--root", str(store)])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    fields = dict(line.split(None, 1) for line in out.strip().splitlines())
    assert fields["items"] == "6" and fields["missing"].startswith("1 item")
    code = main(["benchmark", "export", "medrcube", "cube-release", str(tmp_path / "out"),
                 "--root", str(store)])  # fmt: skip
    assert code == 0
    fields = dict(line.split(None, 1) for line in capsys.readouterr().out.strip().splitlines())
    assert fields["items"] == "6" and (tmp_path / "out").is_dir()
    code = main(["benchmark", "export", "medrcube", "cube-release", str(tmp_path / "out"),
                 "--root", str(store)])  # fmt: skip
    assert code == 1 and "not an empty folder" in capsys.readouterr().err
    bad = tmp_path / "bad"
    (bad / "D").mkdir(parents=True)
    (bad / "D" / "test.json").write_bytes(medrcube.dump_items([
        _item("1", "Q?", ["a", "b"], "c", "", "Disease Diagnosis", "CT", "Chest", "D"),
        _item("2", "Q?", ["a", "b"], "z", "", "Disease Diagnosis", "CT", "Chest", "D"),
    ]))  # fmt: skip
    code = main(["benchmark", "import", "medrcube", str(bad), "--root", str(store)])
    err = capsys.readouterr().err
    assert code == 1
    assert "item #0 (id '1'): gt_answer 'c'" in err and "item #1 (id '2'): gt_answer 'z'" in err
    assert "2 problems; nothing written" in err and "Traceback" not in err
    assert main(["benchmark", "import", "medrcube", str(tmp_path / "nope")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    assert fmt.FORMAT_VERSION >= 2
