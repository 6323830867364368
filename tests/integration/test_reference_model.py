"""The reference VLM end to end on a tiny benchmark: train a few steps on the train split, save in
Hugging Face format, load through the hf backend, answer in the standard format with a confidence.
What it scores is not asserted: that is what the audit is for."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmark import format as fmt
from benchmark.store import Benchmark, write_benchmark
from model_servers.backends import BackendSettings, GenerationInput, create_backend
from model_servers.reference.cli import is_complete, train_into
from model_servers.reference.data import NoTrainItems, load_train_set
from model_servers.reference.train import TrainConfig

REPLY = re.compile(r"^Answer: ([A-G]|UNSURE)\nConfidence: (\d{1,3})$")
# Small enough to train in seconds on a busy CPU; the shipped default is larger.
TINY = TrainConfig(
    image_size=32,
    patch_size=8,
    vision_hidden=32,
    vision_layers=1,
    text_hidden=64,
    text_layers=1,
    batch_size=8,
    answer_steps=40,
    confidence_steps=20,
    learning_rate=5e-3,
    confidence_learning_rate=3e-3,
    minutes=1.0,
    torch_threads=1,
)


def split_benchmark(root: Path, train_subjects: int, audit_subjects: int) -> Benchmark:
    """The brain-MRI suite (small) cut to a few subjects, with subject-level splits: the first
    ``train_subjects`` brain subjects and half the controls train, the rest are audited."""
    from benchmark.suites import brain_mri

    manifest, images = brain_mri.build("small", 0, progress=False)
    for name in fmt.COLUMN_DEFAULTS:  # a builder that does not fill the version 2 columns yet
        if name in manifest.columns and manifest[name].isna().all():
            manifest = manifest.drop(columns=[name])
    manifest = fmt.fill_defaults(manifest)
    brains = sorted(manifest.loc[~manifest["is_control"], "subject_id"].unique())
    controls = sorted(manifest.loc[manifest["is_control"], "subject_id"].unique())
    train = set(brains[:train_subjects]) | set(controls[::2])
    audit = set(brains[train_subjects : train_subjects + audit_subjects]) | set(controls[1::2])
    manifest = manifest[manifest["subject_id"].isin(train | audit)].reset_index(drop=True)
    manifest["split"] = ["train" if s in train else "audit" for s in manifest["subject_id"]]
    used = set(manifest["image_path"])
    kept = {path: data for path, data in images.items() if path in used}
    name = f"brain-mri-split-{train_subjects}-{audit_subjects}"
    return write_benchmark(root, name, "brain-mri", "small", 0, manifest, kept)


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Benchmark:
    return split_benchmark(
        tmp_path_factory.mktemp("benchmarks"), train_subjects=1, audit_subjects=1
    )


def test_train_split_is_disjoint_from_the_audit_subjects(bench: Benchmark) -> None:
    items = bench.items()
    train = load_train_set(bench)
    audit_subjects = set(items.loc[items["split"] == "audit", "subject_id"])
    assert train.subjects and not set(train.subjects) & audit_subjects
    assert len(train.examples) == int((items["split"] == "train").sum())


def test_trains_saves_and_answers_through_the_hf_backend(bench: Benchmark, tmp_path: Path) -> None:
    out = tmp_path / "reference-vlm"
    report = train_into(bench.path, out, TINY, quiet=True)
    assert is_complete(out)
    assert report.answer_steps + report.confidence_steps > 0
    card = (out / "README.md").read_text()
    for fact in (
        bench.id,
        bench.content_hash,
        f"{report.train_subjects} subjects",
        "train accuracy",
    ):
        assert fact in card
    assert f"answer steps: {report.answer_steps}" in card
    saved = json.loads((out / "training.json").read_text())
    assert saved["benchmark_id"] == bench.id and saved["seconds"] > 0
    assert set(saved["train_accuracy"]) == set(report.tasks)

    backend = create_backend("hf", BackendSettings(model_path=out, torch_threads=1))
    backend.load()
    assert backend.describe().model_name == "reference-vlm"  # the folder's name
    items = bench.items()
    audit = items[items["split"] == "audit"].head(6)
    requests = [
        GenerationInput(
            images=[bench.read_image(row.image_path)],
            media_types=[row.media_type],
            prompt=row.prompt,
            max_new_tokens=16,
            request_id=row.item_id,
        )
        for row in audit.itertuples()
    ]
    for request, output in zip(requests, backend.generate_batch(requests), strict=True):  # type: ignore[attr-defined]
        match = REPLY.match(output.text)
        assert match, output.text
        assert 0 <= int(match.group(2)) <= 100
        assert output.finish_reason == "stop"
        assert backend.generate(request).text == output.text

    from model_servers.reference.evaluate import evaluate

    scored = evaluate(out, bench, "audit")
    assert scored.items == int((items["split"] == "audit").sum())
    assert set(scored.accuracy) == set(items.loc[items["split"] == "audit", "task"])
    assert 0 <= scored.mean_confidence <= 100


def test_a_benchmark_without_train_items_is_a_clear_error(
    bench: Benchmark, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cli.main import main

    items = bench.items()
    items["split"] = "audit"
    images = {p: bench.read_image(p) for p in set(items["image_path"])}
    audit_only = write_benchmark(tmp_path, "audit-only", "brain-mri", "small", 0, items, images)
    with pytest.raises(NoTrainItems, match="no train items"):
        load_train_set(audit_only)
    out = tmp_path / "model"
    code = main(
        ["reference-model", "train", "--benchmark", str(audit_only.path), "--out", str(out)]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "has no train items" in err and audit_only.id in err
    assert not out.exists()


def test_the_same_seed_trains_the_same_weights(bench: Benchmark, tmp_path: Path) -> None:
    from model_servers.backends.hf import model_version

    first = train_into(bench.path, tmp_path / "a", TINY, quiet=True)
    second = train_into(bench.path, tmp_path / "b", TINY, quiet=True)
    assert not (first.cut_short or second.cut_short)
    assert model_version(tmp_path / "a") == model_version(tmp_path / "b")
