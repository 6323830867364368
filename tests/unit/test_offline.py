"""``vigil grade``: offline grading of a responses file, its output and its one-line errors."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from cli.main import main
from grader.figures import compute_run_figures
from grader.grading import KEY_COLUMNS, grade, key_from_row
from grader.metrics import METRIC_NAMES


@pytest.fixture(scope="module")
def responses(small_benchmark) -> pd.DataFrame:
    """Two models' answers to every item: one always right (stating 90), one always "A" at 60.

    The right one abstains on the items that expect an abstention (their answer is UNSURE).
    """
    items = small_benchmark.items()
    right = pd.DataFrame(
        {
            "item_id": items.item_id,
            "raw_text": [
                "UNSURE" if abstain else f"Answer: {letter}\nConfidence: 90"
                for letter, abstain in zip(items.answer_letter, items.expect_abstain, strict=True)
            ],
            "model": "oracle",
        }
    )
    always_a = pd.DataFrame(
        {"item_id": items.item_id, "raw_text": "A\nConfidence: 60", "model": "always-a"}
    )
    both = pd.concat([right, always_a], ignore_index=True)
    both.loc[0, "outcome"] = "timeout"  # one lost request, kept apart
    both.loc[0, "raw_text"] = None
    return both


def write_jsonl(df: pd.DataFrame, path) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in df.to_dict("records")))


def run(argv, capsys) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_json_output_by_model_and_task(small_benchmark, responses, tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    write_jsonl(responses.where(responses.notna(), None), path)
    argv = ["grade", "--benchmark", str(small_benchmark.path), "--responses", str(path), "--json",
            "--group-by", "task", "--resamples", "200"]  # fmt: skip
    code, out, err = run(argv, capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["benchmark_hash"] == small_benchmark.content_hash
    groups = {tuple(sorted(g["group"].items())): g for g in doc["groups"]}
    oracle = groups[(("model", "oracle"),)]
    n_items = small_benchmark.meta.item_count
    assert oracle["response_count"] == n_items
    m = {k: v["value"] for k, v in oracle["metrics"].items()}
    assert set(m) == set(METRIC_NAMES)
    n_abstain = int(small_benchmark.items().expect_abstain.sum())
    assert m["accuracy"] == 1.0 and m["abstention_appropriate"] == 1.0
    assert m["over_abstention"] == 0.0
    assert m["coverage"] == pytest.approx((n_items - 1 - n_abstain) / (n_items - 1))
    assert m["transport_error_rate"] == pytest.approx(1 / n_items)
    assert m["ece"] == pytest.approx(0.1) and m["brier"] == pytest.approx(0.01)
    assert m["hallucination_rate"] is None  # no open-ended items in this benchmark
    assert oracle["metrics"]["accuracy"]["lower"] == 1.0
    plane = groups[(("model", "always-a"), ("task", "plane"))]
    assert plane["metrics"]["coverage"]["value"] == 1.0
    assert 0 < plane["metrics"]["accuracy"]["value"] < 1
    assert plane["metrics"]["accuracy"]["lower"] <= plane["metrics"]["accuracy"]["value"]


def test_figures_equal_the_grader_path(small_benchmark, responses, tmp_path, capsys):
    """The offline figures are the grader's: grade + compute_run_figures on the same rows."""
    sub = responses[responses.model == "always-a"].drop(columns=["outcome"])
    path = tmp_path / "r.parquet"
    sub.to_parquet(path)
    code, out, err = run(["grade", "--benchmark", str(small_benchmark.path), "--responses",
                          str(path), "--json", "--resamples", "0"], capsys)  # fmt: skip
    assert code == 0, err
    ours = json.loads(out)["groups"][0]["metrics"]
    key = {
        str(r["item_id"]): key_from_row(r)
        for r in small_benchmark.items(columns=KEY_COLUMNS).to_dict("records")
    }
    rows = []
    for item_id, text in zip(sub.item_id, sub.raw_text, strict=True):
        item = key[item_id]
        g = grade("ok", text, item)
        rows.append({"subject_id": item.subject_id, "task": item.task, "format": item.format,
                     "outcome": g.outcome, "correct": g.correct, "confidence": g.confidence,
                     "true_class": item.answer, "pred_class": g.pred_class, **item.axes})  # fmt: skip
    metrics, _ = compute_run_figures(
        pd.DataFrame(rows), "r", "m", final=False, n_resamples=0, seed=0, min_subjects=5
    )
    top = metrics[(metrics.task == "all") & (metrics.format == "all") & (metrics.group_axis == "")]
    for name, value in zip(top.metric, top.value, strict=True):
        if value == value:  # not NaN
            assert ours[name]["value"] == pytest.approx(value, abs=1e-12), name


def test_table_output(small_benchmark, responses, tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    write_jsonl(responses[responses.model == "oracle"].drop(columns=["outcome", "raw_text"])
                .assign(raw_text="UNSURE"), path)  # fmt: skip
    code, out, err = run(["grade", "--benchmark", str(small_benchmark.path), "--responses",
                          str(path), "--resamples", "50", "--group-by", "task,plane"], capsys)  # fmt: skip
    assert code == 0, err
    assert "model=oracle:" in out and "model=oracle, task=plane, plane=axial:" in out
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("abstention_rate"))
    assert line.split()[1] == "1.000"


@pytest.mark.parametrize(
    ("content", "suffix", "message"),
    [
        ('{"item_id": "nope", "raw_text": "A"}\n', ".jsonl", "row 1 ('nope')"),
        ('{"raw_text": "A"}\n', ".jsonl", "missing column(s) item_id"),
        ('{"item_id": "x", "raw_text": "A"}\n{oops\n', ".jsonl", "line 2: invalid JSON"),
        ("[1, 2]\n", ".jsonl", "line 1: expected a JSON object"),
        ("", ".jsonl", "no responses"),
        ("not parquet", ".parquet", "not a readable Parquet file"),
        ("x", ".csv", "unknown responses format '.csv'"),
        (
            '{"item_id": "x", "raw_text": "A", "outcome": "lost"}\n',
            ".jsonl",
            "row 1: field outcome",
        ),
        ('{"item_id": "x", "raw_text": "A", "format": "essay"}\n', ".jsonl", "row 1: field format"),
        ('{"item_id": "", "raw_text": "A"}\n', ".jsonl", "row 1: field item_id is empty"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(small_benchmark, tmp_path, capsys, content, suffix,
                                          message):  # fmt: skip
    path = tmp_path / f"bad{suffix}"
    path.write_text(content)
    code, out, err = run(["grade", "--benchmark", str(small_benchmark.path), "--responses",
                          str(path)], capsys)  # fmt: skip
    assert code == 2
    assert str(path) in err and message in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_missing_file_unknown_benchmark_and_bad_axis(small_benchmark, responses, tmp_path,
                                                     capsys):  # fmt: skip
    missing = tmp_path / "absent.jsonl"
    code, _, err = run(["grade", "--benchmark", str(small_benchmark.path), "--responses",
                        str(missing)], capsys)  # fmt: skip
    assert code == 2 and f"{missing}: no such file" in err
    path = tmp_path / "r.jsonl"
    write_jsonl(responses.head(3).drop(columns=["outcome"]), path)
    code, _, err = run(["grade", "--benchmark", "no-such-benchmark", "--root", str(tmp_path),
                        "--responses", str(path)], capsys)  # fmt: skip
    assert code == 2 and "no-such-benchmark" in err and "Traceback" not in err
    code, _, err = run(["grade", "--benchmark", str(small_benchmark.path), "--responses",
                        str(path), "--group-by", "colour"], capsys)  # fmt: skip
    assert code == 2 and "unknown --group-by axis 'colour'" in err
