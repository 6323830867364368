"""The benchmark format, validation and the content-addressed store, on small hand-made manifests."""

from __future__ import annotations

import json
import math
import os

import grpc
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from benchmark import format as fmt
from benchmark.errors import BenchmarkInvalid, BenchmarkNotFound
from benchmark.store import (
    Benchmark,
    default_root,
    list_benchmarks,
    open_benchmark,
    write_benchmark,
)
from benchmark.validate import validate_benchmark, validate_manifest


def _png(level: int) -> bytes:
    pixels = np.full((8, 8), level, dtype=np.uint8)
    pixels[0, 0] = 255 - level
    return fmt.encode_png(pixels)


def _manifest(n_images: int = 3) -> tuple[pd.DataFrame, dict[str, bytes]]:
    """A valid manifest: two plane questions per image plus one text-only item."""
    rows, images = [], {}
    for i in range(n_images):
        png = _png(10 * i)
        path = fmt.image_path_for(png)
        images[path] = png
        for k, options in enumerate((["axial", "coronal", "sagittal"], ["sagittal", "axial"])):
            answer = options[(i + k) % len(options)]
            rows.append(
                {
                    "item_id": f"img-{i}_q{k}",
                    "subject_id": f"sub-{i // 2}",
                    "image_path": path,
                    "media_type": "image/png",
                    "task": "plane",
                    "format": "mc",
                    "phrasing": "neutral",
                    "prompt": f"Which plane? UNSURE allowed. Confidence 0-100. ({i}, {k})",
                    "options": options,
                    "answer": answer,
                    "answer_letter": "ABC"[options.index(answer)],
                    "option_order": "|".join(options),
                    "is_control": False,
                    "modality": "MR",
                    "anatomy": "brain",
                    "dataset": "handmade",
                    "plane": answer,
                    "sequence": "T1",
                    "depth": 0.5,
                    "tumor_voxels": 0,
                    "hierarchy": "low",
                    "laterality": "none",
                    "supported_findings": [],
                    "split": "audit" if i < 2 else "train",
                    "image_missing": False,
                    "expect_abstain": False,
                    "source_json": "",
                }
            )
    rows.append(
        {
            **rows[0],
            "item_id": "text-only",
            "subject_id": "sub-text",
            "image_path": "",
            "media_type": "",
            "depth": float("nan"),
            "tumor_voxels": -1,
            "image_missing": True,
        }
    )
    frame = pd.DataFrame(rows, columns=list(fmt.COLUMNS))
    return frame, images


def _problems_about(problems: list[str], needle: str) -> list[str]:
    return [p for p in problems if needle in p]


def test_hand_made_manifest_is_valid():
    manifest, images = _manifest()
    assert validate_manifest(manifest, images) == []


def test_duplicate_item_ids_are_reported():
    manifest, images = _manifest()
    manifest.loc[1, "item_id"] = manifest.loc[0, "item_id"]
    problems = validate_manifest(manifest, images)
    assert any("'img-0_q0'" in p and "appears 2 times" in p for p in problems), problems


def test_answer_not_in_options_is_reported():
    manifest, images = _manifest()
    manifest.at[2, "answer"] = "oblique"
    problems = validate_manifest(manifest, images)
    assert _problems_about(problems, "'img-1_q0'") == [
        "item 'img-1_q0': answer 'oblique' is not one of the options "
        "['axial', 'coronal', 'sagittal']"
    ]


def test_duplicated_options_and_bad_letter_and_order_are_reported():
    manifest, images = _manifest()
    manifest.at[0, "options"] = ["axial", "axial", "sagittal"]
    manifest.at[0, "option_order"] = "axial|axial|sagittal"
    manifest.at[3, "answer_letter"] = "B"
    manifest.at[4, "option_order"] = "x|y|z"
    problems = validate_manifest(manifest, images)
    assert any("'img-0_q0'" in p and "duplicated options ['axial']" in p for p in problems)
    assert any("'img-1_q1'" in p and "answer_letter 'B'" in p for p in problems)
    assert any("'img-2_q0'" in p and "option_order" in p for p in problems)


def test_too_few_options_are_reported():
    manifest, images = _manifest()
    manifest.at[0, "options"] = ["axial"]
    manifest.at[0, "option_order"] = "axial"
    manifest.at[0, "answer"] = "axial"
    manifest.at[0, "answer_letter"] = "A"
    problems = validate_manifest(manifest, images)
    assert any("'img-0_q0'" in p and "at least 2 options" in p for p in problems)


@pytest.mark.parametrize("bad_path", ["../x.png", "images/../../x.png", "/etc/x.png"])
def test_image_paths_escaping_the_folder_are_reported(bad_path):
    manifest, images = _manifest()
    manifest.at[0, "image_path"] = bad_path
    problems = validate_manifest(manifest, images)
    assert any("'img-0_q0'" in p and repr(bad_path) in p for p in problems), problems


def test_corrupt_png_is_reported():
    manifest, images = _manifest()
    path = manifest.at[0, "image_path"]
    images[path] = images[path][:20] + b"garbage" + images[path][27:]
    problems = validate_manifest(manifest, images)
    assert any(p.startswith(f"{path}: does not decode") for p in problems), problems


def test_missing_image_and_unused_image_are_reported():
    manifest, images = _manifest()
    missing = manifest.at[0, "image_path"]
    del images[missing]
    images["images/0123456789abcdef.png"] = _png(99)
    problems = validate_manifest(manifest, images)
    assert any(p.startswith(f"{missing}: missing; used by item 'img-0_q0'") for p in problems)
    assert "images/0123456789abcdef.png: not used by any item" in problems


def test_missing_column_is_reported():
    manifest, images = _manifest()
    problems = validate_manifest(manifest.drop(columns=["answer_letter"]), images)
    assert f"{fmt.MANIFEST_FILE}: missing column 'answer_letter'" in problems


def test_wrong_types_and_empty_fields_are_reported():
    manifest, images = _manifest()
    manifest["tumor_voxels"] = manifest["tumor_voxels"].astype(float)
    manifest.at[1, "prompt"] = "  "
    manifest.at[2, "subject_id"] = ""
    manifest.at[3, "depth"] = 1.5
    manifest.at[4, "format"] = "essay"
    problems = validate_manifest(manifest, images)
    assert any("'tumor_voxels' must be int64" in p for p in problems)
    assert "item 'img-0_q1': prompt is empty" in problems
    assert "item 'img-1_q0': subject_id is empty" in problems
    assert any("'img-1_q1'" in p and "depth 1.5" in p for p in problems)
    assert any("'img-2_q0'" in p and "unknown format 'essay'" in p for p in problems)


def test_bad_manifest_is_not_written_and_every_bad_item_is_named(tmp_path):
    manifest, images = _manifest()
    manifest.at[0, "answer"] = "oblique"
    manifest.at[3, "options"] = ["axial", "axial"]
    manifest.at[5, "image_path"] = "../x.png"
    root = tmp_path / "store"
    with pytest.raises(BenchmarkInvalid) as info:
        write_benchmark(root, "bad", "handmade", "tiny", 0, manifest, images)
    message = str(info.value)
    for item_id in ("img-0_q0", "img-1_q1", "img-2_q1"):
        assert item_id in message
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert len(info.value.problems) >= 3
    assert not root.exists() or list(root.iterdir()) == []


def test_bad_name_is_refused(tmp_path):
    manifest, images = _manifest()
    with pytest.raises(BenchmarkInvalid, match="name 'Bad Name'"):
        write_benchmark(tmp_path, "Bad Name", "handmade", "tiny", 0, manifest, images)
    assert list(tmp_path.iterdir()) == []


def _write(tmp_path, name="handmade-tiny", seed=0) -> Benchmark:
    manifest, images = _manifest()
    return write_benchmark(tmp_path, name, "handmade", "tiny", seed, manifest, images)


def test_written_benchmark_is_valid_and_content_addressed(tmp_path):
    bench = _write(tmp_path)
    assert bench.id == f"handmade-tiny-{bench.content_hash[:12]}"
    assert bench.path == tmp_path / bench.id
    assert validate_benchmark(bench.path) == []
    meta = json.loads((bench.path / fmt.META_FILE).read_text())
    assert meta["format_version"] == 2
    assert meta["item_count"] == 7 and meta["subject_count"] == 3
    assert meta["tasks"] == {"plane": 7}
    assert meta["created_by"].startswith("vigil ")
    stored = sorted(p.name for p in (bench.path / fmt.IMAGES_DIR).iterdir())
    assert len(stored) == 3
    for name in stored:
        data = (bench.path / fmt.IMAGES_DIR / name).read_bytes()
        assert name == fmt.sha256_hex(data)[:16] + ".png"
    schema = pq.read_schema(bench.path / fmt.MANIFEST_FILE)
    assert schema.names == list(fmt.COLUMNS)
    for field in fmt.MANIFEST_SCHEMA:
        assert schema.field(field.name).type == field.type


def test_writing_the_same_benchmark_twice_returns_the_existing_one(tmp_path):
    first = _write(tmp_path)
    second = _write(tmp_path)
    assert second.id == first.id
    assert [p.name for p in tmp_path.iterdir()] == [first.id]


def test_content_hash_ignores_row_order_but_not_content(tmp_path):
    manifest, images = _manifest()
    a = write_benchmark(tmp_path / "a", "t", "s", "x", 0, manifest, images)
    shuffled = manifest.sample(frac=1.0, random_state=3).reset_index(drop=True)
    b = write_benchmark(tmp_path / "b", "t", "s", "x", 0, shuffled, images)
    assert a.content_hash == b.content_hash
    changed = manifest.copy()
    changed.at[0, "prompt"] = changed.at[0, "prompt"] + " "
    c = write_benchmark(tmp_path / "c", "t", "s", "x", 0, changed, images)
    assert c.content_hash != a.content_hash


def test_validate_benchmark_catches_tampering(tmp_path):
    bench = _write(tmp_path)
    image = sorted((bench.path / fmt.IMAGES_DIR).iterdir())[0]
    image.write_bytes(image.read_bytes()[:30])
    meta = json.loads((bench.path / fmt.META_FILE).read_text())
    meta["item_count"] = 8
    (bench.path / fmt.META_FILE).write_text(json.dumps(meta))
    problems = validate_benchmark(bench.path)
    rel = f"images/{image.name}"
    assert any(p.startswith(f"{rel}: does not decode") for p in problems), problems
    assert any(p.startswith(f"{rel}: its bytes do not hash") for p in problems)
    assert any("content_hash" in p and "does not match" in p for p in problems)
    assert f"{fmt.META_FILE}: item_count is 8, manifest has 7" in problems


def test_validate_benchmark_catches_missing_column_and_missing_files(tmp_path):
    bench = _write(tmp_path)
    table = pq.read_table(bench.path / fmt.MANIFEST_FILE).drop_columns(["answer"])
    pq.write_table(table, bench.path / fmt.MANIFEST_FILE)
    problems = validate_benchmark(bench.path)
    assert f"{fmt.MANIFEST_FILE}: missing column 'answer'" in problems
    (bench.path / fmt.META_FILE).unlink()
    assert f"{fmt.META_FILE}: missing" in validate_benchmark(bench.path)
    assert validate_benchmark(tmp_path / "nowhere") == [f"{tmp_path / 'nowhere'}: not a folder"]


def test_open_benchmark_by_name_id_and_path(tmp_path):
    bench = _write(tmp_path)
    assert open_benchmark("handmade-tiny", tmp_path).id == bench.id
    assert open_benchmark(bench.id, tmp_path).id == bench.id
    assert open_benchmark(bench.path, tmp_path / "elsewhere").id == bench.id
    assert open_benchmark(str(bench.path), tmp_path / "elsewhere").id == bench.id


def test_open_benchmark_by_name_picks_the_newest(tmp_path):
    older = _write(tmp_path, seed=0)
    manifest, images = _manifest(n_images=2)
    newer = write_benchmark(tmp_path, "handmade-tiny", "handmade", "tiny", 1, manifest, images)
    assert newer.id != older.id
    os.utime(older.path / fmt.META_FILE, ns=(1_000_000_000, 1_000_000_000))
    os.utime(newer.path / fmt.META_FILE, ns=(2_000_000_000, 2_000_000_000))
    assert open_benchmark("handmade-tiny", tmp_path).id == newer.id


def test_unknown_benchmark_is_not_found_and_names_the_ref(tmp_path):
    bench = _write(tmp_path)
    with pytest.raises(BenchmarkNotFound) as info:
        open_benchmark("brain-mri-huge", tmp_path)
    assert "'brain-mri-huge'" in info.value.message
    assert bench.id in info.value.message
    assert info.value.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(BenchmarkNotFound, match="holds no benchmarks"):
        open_benchmark("anything", tmp_path / "empty")


def test_open_benchmark_on_a_broken_folder_is_invalid(tmp_path):
    broken = tmp_path / "broken-000000000000"
    broken.mkdir()
    (broken / fmt.META_FILE).write_text("{not json")
    with pytest.raises(BenchmarkInvalid, match="not valid JSON"):
        open_benchmark(broken.name, tmp_path)
    assert list_benchmarks(tmp_path) == []


def test_items_and_read_image(tmp_path):
    bench = _write(tmp_path)
    items = bench.items()
    assert list(items.columns) == list(fmt.COLUMNS)
    assert len(items) == 7
    assert isinstance(items.at[0, "options"], list)
    assert math.isnan(items.set_index("item_id").at["text-only", "depth"])
    some = bench.items(columns=["item_id", "answer"])
    assert list(some.columns) == ["item_id", "answer"]
    path = items.at[0, "image_path"]
    assert bench.read_image(path).startswith(b"\x89PNG")
    with pytest.raises(BenchmarkInvalid, match="unknown manifest column"):
        bench.items(columns=["nope"])


@pytest.mark.parametrize("bad", ["../escape.png", "/etc/passwd", "images/../../x.png", ""])
def test_read_image_refuses_escaping_paths(tmp_path, bad):
    bench = _write(tmp_path)
    with pytest.raises(BenchmarkInvalid):
        bench.read_image(bad)


def test_read_image_of_a_missing_file_is_not_found(tmp_path):
    bench = _write(tmp_path)
    with pytest.raises(BenchmarkNotFound, match="images/ffffffffffffffff.png"):
        bench.read_image("images/ffffffffffffffff.png")


def test_list_benchmarks_skips_unfinished_and_broken_folders(tmp_path):
    bench = _write(tmp_path)
    (tmp_path / ".tmp-abandoned").mkdir()
    (tmp_path / "stray-folder").mkdir()
    assert [b.id for b in list_benchmarks(tmp_path)] == [bench.id]
    assert list_benchmarks(tmp_path / "missing") == []


def test_default_root_follows_vigil_data_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("VIGIL_DATA_DIR", raising=False)
    assert str(default_root()) == "var/benchmarks"
    monkeypatch.setenv("VIGIL_DATA_DIR", str(tmp_path))
    assert default_root() == tmp_path / "benchmarks"


def test_canonical_rows_are_deterministic():
    rows = [{"item_id": "b", "x": float("nan"), "y": [1, 2]}, {"item_id": "a", "x": 0.1, "y": []}]
    assert fmt.canonical_rows(rows) == [
        '{"item_id":"a","x":0.1,"y":[]}',
        '{"item_id":"b","x":null,"y":[1,2]}',
    ]


def test_png_encoding_is_reproducible():
    pixels = np.arange(64, dtype=np.uint8).reshape(8, 8)
    assert fmt.encode_png(pixels) == fmt.encode_png(pixels.copy())
    with pytest.raises(ValueError):
        fmt.encode_png(pixels.astype(np.float32))


# --- format version 2 -------------------------------------------------------------------------


def _open_row(manifest: pd.DataFrame, item_id: str, **changes) -> dict:
    """An open-ended copy of the first row: the answer space in canonical order, no letter."""
    row = manifest.iloc[0].to_dict()
    row.update(
        item_id=item_id,
        format="open",
        options=["axial", "coronal", "sagittal"],
        answer_letter="",
        option_order="",
    )
    row.update(changes)
    return row


def _with_rows(manifest: pd.DataFrame, rows: list[dict]) -> pd.DataFrame:
    extra = pd.DataFrame(rows, columns=list(fmt.COLUMNS))
    return pd.concat([manifest, extra], ignore_index=True)


def test_format_v2_exports_its_vocabularies():
    assert fmt.FORMAT_VERSION == 2 and fmt.SUPPORTED_FORMAT_VERSIONS == (1, 2)
    assert set(fmt.FORMATS) == {"mc", "open"}
    assert fmt.HIERARCHY == ("low", "mid", "high", "")
    assert fmt.SPLITS == ("audit", "train")
    assert fmt.LATERALITIES == ("left", "right", "bilateral", "none", "")
    assert "tumor" in fmt.FINDINGS and "laterality_bilateral" in fmt.FINDINGS
    assert fmt.COLUMNS[-7:] == (
        "hierarchy", "laterality", "supported_findings", "split", "image_missing",
        "expect_abstain", "source_json",
    )  # fmt: skip
    assert fmt.COLUMNS[:-7] == fmt.V1_COLUMNS


def test_open_and_abstention_items_are_valid():
    manifest, images = _manifest()
    abstain_mc = manifest.iloc[0].to_dict()
    abstain_mc.update(item_id="abstain-mc", answer="UNSURE", answer_letter="",
                      expect_abstain=True, hierarchy="")  # fmt: skip
    rows = [
        _open_row(
            manifest,
            "open-ok",
            answer="coronal",
            supported_findings=["tumor", "lesion", "laterality_left"],
        ),  # fmt: skip
        _open_row(manifest, "open-abstain", answer="UNSURE", expect_abstain=True),
        abstain_mc,
    ]
    assert validate_manifest(_with_rows(manifest, rows), images) == []


def test_format_v2_rules_are_enforced_per_item():
    manifest, images = _manifest()
    bad_mc_abstain = manifest.iloc[0].to_dict()
    bad_mc_abstain.update(item_id="mc-abstain", answer="UNSURE", expect_abstain=True)
    unsure_without_flag = manifest.iloc[0].to_dict()
    unsure_without_flag.update(item_id="unsure-no-flag", answer="UNSURE", answer_letter="")
    rows = [
        _open_row(manifest, "open-letter", answer="axial", answer_letter="A"),
        _open_row(manifest, "open-order", answer="axial", option_order="axial|coronal|sagittal"),
        _open_row(manifest, "open-outside", answer="oblique"),
        _open_row(manifest, "bad-split", answer="axial", split="test"),
        _open_row(manifest, "bad-hier", answer="axial", hierarchy="top"),
        _open_row(manifest, "bad-lat", answer="axial", laterality="centre"),
        _open_row(
            manifest, "bad-find", answer="axial", supported_findings=["tumour", "tumor", "tumor"]
        ),  # fmt: skip
        _open_row(manifest, "missing-with-path", answer="axial", image_missing=True),
        _open_row(manifest, "abstain-wrong", answer="axial", expect_abstain=True),
        bad_mc_abstain,
        unsure_without_flag,
    ]
    problems = validate_manifest(_with_rows(manifest, rows), images)

    def about(item_id: str) -> str:
        found = _problems_about(problems, f"'{item_id}'")
        assert found, (item_id, problems)
        return " ".join(found)

    assert "open item has no answer_letter, got 'A'" in about("open-letter")
    assert "open item has no option_order" in about("open-order")
    assert "'oblique' is not in the task's answer space" in about("open-outside")
    assert "split 'test' is not one of 'audit', 'train'" in about("bad-split")
    assert "hierarchy 'top'" in about("bad-hier")
    assert "laterality 'centre'" in about("bad-lat")
    text = about("bad-find")
    assert "['tumour'] are not in the findings vocabulary" in text and "repeats ['tumor']" in text
    assert "image_missing is set, so image_path must be ''" in about("missing-with-path")
    assert "expect_abstain is set, so answer must be 'UNSURE'" in about("abstain-wrong")
    assert "has no answer_letter" in about("mc-abstain")
    assert "answer is 'UNSURE' but expect_abstain is not set" in about("unsure-no-flag")


def test_wrong_types_of_new_columns_are_reported():
    manifest, images = _manifest()
    manifest["image_missing"] = manifest["image_missing"].astype(object)
    manifest.at[0, "image_missing"] = "no"
    manifest.at[1, "supported_findings"] = "tumor"
    manifest.at[2, "split"] = None
    problems = validate_manifest(manifest, images)
    assert "item 'img-0_q0': column 'image_missing' must be a bool" in problems
    assert "item 'img-0_q1': column 'supported_findings' must be a list of strings" in problems
    assert "item 'img-1_q0': column 'split' must be a string" in problems


def _write_v1(root, name="old-tiny"):
    """A version 1 benchmark folder exactly as the version 1 code wrote it."""
    manifest, images = _manifest()
    table = pa.Table.from_pandas(
        manifest.loc[:, list(fmt.V1_COLUMNS)], schema=fmt.schema_for(1), preserve_index=False
    ).replace_schema_metadata(None)
    digests = {p: fmt.sha256_hex(images[p]) for p in images}
    digest = fmt.content_hash(table, digests, version=1)
    folder = root / fmt.benchmark_id(name, digest)
    (folder / fmt.IMAGES_DIR).mkdir(parents=True)
    for path, data in images.items():
        (folder / path).write_bytes(data)
    pq.write_table(table, folder / fmt.MANIFEST_FILE)
    meta = {"format_version": 1, "name": name, "suite": "handmade", "size": "tiny", "seed": 0,
            "content_hash": digest, "item_count": len(manifest), "subject_count": 3,
            "tasks": {"plane": len(manifest)}, "created_by": "vigil 0.1.0"}  # fmt: skip
    (folder / fmt.META_FILE).write_text(json.dumps(meta))
    return folder


def test_a_version_1_benchmark_stays_readable_and_valid(tmp_path):
    folder = _write_v1(tmp_path)
    assert validate_benchmark(folder) == []
    bench = open_benchmark(folder.name, tmp_path)
    assert bench.meta.format_version == 1
    items = bench.items()
    assert list(items.columns) == list(fmt.COLUMNS)
    assert set(items["split"]) == {"audit"} and set(items["hierarchy"]) == {""}
    assert set(items["laterality"]) == {""}
    assert items["supported_findings"].map(list).tolist() == [[]] * len(items)
    assert items["image_missing"].dtype == bool and not items["image_missing"].any()
    assert items["expect_abstain"].dtype == bool and not items["expect_abstain"].any()
    assert set(items["source_json"]) == {""}
    some = bench.items(columns=["item_id", "split", "options", "expect_abstain"])
    assert list(some.columns) == ["item_id", "split", "options", "expect_abstain"]
    assert isinstance(some.at[0, "options"], list)
    # the v1 hash is kept: tampering is still caught
    meta = json.loads((folder / fmt.META_FILE).read_text())
    meta["content_hash"] = "0" * 64
    (folder / fmt.META_FILE).write_text(json.dumps(meta))
    assert any("content_hash" in p for p in validate_benchmark(folder))


def test_unsupported_format_version_is_reported(tmp_path):
    bench = _write(tmp_path)
    meta = json.loads((bench.path / fmt.META_FILE).read_text())
    meta["format_version"] = 3
    (bench.path / fmt.META_FILE).write_text(json.dumps(meta))
    assert any("format_version 3 is not supported" in p for p in validate_benchmark(bench.path))


def test_v2_benchmark_round_trips_its_new_columns(tmp_path):
    manifest, images = _manifest()
    rows = [_open_row(manifest, "open-1", answer="sagittal", laterality="left",
                      supported_findings=["tumor", "laterality_left"], split="train")]  # fmt: skip
    bench = write_benchmark(tmp_path, "v2", "handmade", "tiny", 0, _with_rows(manifest, rows),
                            images)  # fmt: skip
    assert validate_benchmark(bench.path) == []
    item = bench.items().set_index("item_id").loc["open-1"]
    assert item["supported_findings"] == ["tumor", "laterality_left"]
    assert (item["format"], item["laterality"], item["split"]) == ("open", "left", "train")
    assert bench.items().set_index("item_id").at["text-only", "image_missing"]
