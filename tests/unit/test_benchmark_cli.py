"""``vigil benchmark`` commands: output, exit codes and one-line errors."""

from __future__ import annotations

import argparse
import json
import shutil

import pytest

from benchmark import format as fmt
from benchmark.cli import add_benchmark_commands, main


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli-store")
    code = main(["benchmark", "build", "brain-mri", "--size", "small", "--root", str(root),
                 "--no-progress"])  # fmt: skip
    assert code == 0
    (folder,) = [p for p in root.iterdir() if not p.name.startswith(".")]
    return root, folder


def test_build_prints_id_counts_hash_and_path(built, capsys):
    root, folder = built
    code = main(["benchmark", "build", "brain-mri", "--root", str(root), "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0
    fields = dict(line.split(None, 1) for line in out.strip().splitlines())
    meta = json.loads((folder / fmt.META_FILE).read_text())
    assert fields["id"] == folder.name
    assert int(fields["items"]) == meta["item_count"]
    assert int(fields["subjects"]) == meta["subject_count"]
    assert fields["hash"] == meta["content_hash"]
    assert fields["path"] == str(folder.resolve())


def test_validate_valid_benchmark(built, capsys):
    root, folder = built
    assert main(["benchmark", "validate", str(folder)]) == 0
    assert capsys.readouterr().out.strip() == "valid"
    assert main(["benchmark", "validate", "brain-mri-small", "--root", str(root)]) == 0


def test_validate_prints_every_problem_and_fails(built, tmp_path, capsys):
    _, folder = built
    copy = tmp_path / folder.name
    shutil.copytree(folder, copy)
    images = sorted((copy / fmt.IMAGES_DIR).iterdir())
    images[0].write_bytes(b"not a png")
    images[1].unlink()
    assert main(["benchmark", "validate", str(copy)]) == 1
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    assert any(line.startswith(f"images/{images[0].name}: does not decode") for line in lines)
    assert any(line.startswith(f"images/{images[1].name}: missing") for line in lines)
    assert "invalid:" in captured.err


def test_list_shows_stored_benchmarks(built, capsys, tmp_path):
    root, folder = built
    assert main(["benchmark", "list", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert folder.name in out and "brain-mri" in out and "small" in out
    assert main(["benchmark", "list", "--root", str(tmp_path / "none")]) == 0
    assert "no benchmarks" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["build", "brain-ct"], "unknown suite 'brain-ct'"),
        (["build", "brain-mri", "--size", "huge"], "unknown size 'huge'"),
        (["build", "brain-mri", "--seed", "-1"], "--seed must be 0 or more"),
        (["validate", "no-such-benchmark"], "'no-such-benchmark' not found"),
    ],
)
def test_user_mistakes_give_one_line_errors(argv, message, tmp_path, capsys):
    code = main(["benchmark", *argv, "--root", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_commands_plug_into_another_parser():
    parser = argparse.ArgumentParser(prog="vigil")
    add_benchmark_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["benchmark", "list", "--root", "x"])
    assert callable(args.handler)
    args = parser.parse_args(["benchmark", "build", "brain-mri", "--size", "paper", "--seed", "3"])
    assert (args.suite, args.size, args.seed) == ("brain-mri", "paper", 3)
