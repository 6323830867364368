"""The benchmark format, validation and the content-addressed store, on small hand-made manifests."""

from __future__ import annotations

import json
import math
import os

import grpc
import numpy as np
import pandas as pd
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
    assert meta["format_version"] == 1
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
