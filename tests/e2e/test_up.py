"""``vigil up --once`` as a user runs it (``make run ARGS=--once``): one round per default model,
graded, a summary table, everything stopped, exit 0."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from tests.stack import REPO, audit_item_ids

ZERO_PORTS = ["--gateway-port", "0", "--grader-port", "0", "--model-port", "0",
              "--gateway-metrics-port", "0", "--grader-metrics-port", "0",
              "--model-metrics-port", "0"]  # fmt: skip
# The tests serve the untrained tiny model (the default trains the reference VLM once).
ZERO_PORTS += ["--hf-model", "tiny"]  # fmt: skip


def test_up_once_prints_summary_and_exits_zero(
    tmp_path: Path, small_benchmark, tiny_model_dir
) -> None:
    data = tmp_path / "var"
    # Reuse the session's benchmark and tiny model (vigil up finds and keeps them).
    shutil.copytree(small_benchmark.path, data / "benchmarks" / small_benchmark.id)
    shutil.copytree(tiny_model_dir, data / "models" / "tiny-llava")
    env = dict(os.environ, VIGIL_DATA_DIR=str(data))
    proc = subprocess.run(
        [sys.executable, "-m", "cli.main", "up", "--once", *ZERO_PORTS],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    table = out[out.index("model ") :]
    for model in ("random-baseline", "tiny-llava"):
        row = next(line for line in table.splitlines() if line.startswith(model))
        assert f" {len(audit_item_ids(small_benchmark))} " in row
    assert "coverage" in table and "ece" in table and "cw_rate" in table
    # The hf backend offers log-probabilities: its stated confidence is set beside them.
    assert "tiny-llava: stated confidence vs answer-token probability" in table
    # Everything stopped: the children's logs end with their stop messages.
    logs = data / "logs"
    assert "gateway stopping" in (logs / "gateway.log").read_text()
    assert "grader stopping" in (logs / "grader.log").read_text()


def test_up_reports_a_failed_start_clearly(tmp_path: Path, small_benchmark, tiny_model_dir) -> None:
    data = tmp_path / "var"
    shutil.copytree(small_benchmark.path, data / "benchmarks" / small_benchmark.id)
    # A "model" folder that is not a model: the hf server cannot load it.
    (data / "models" / "tiny-llava").mkdir(parents=True)
    (data / "models" / "tiny-llava" / "config.json").write_text("{}")
    env = dict(os.environ, VIGIL_DATA_DIR=str(data))
    proc = subprocess.run(
        [sys.executable, "-m", "cli.main", "up", "--once", *ZERO_PORTS],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=200,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "tiny-llava" in proc.stderr and "Traceback" not in proc.stderr


def test_up_names_the_service_that_cannot_start(
    tmp_path: Path, small_benchmark, tiny_model_dir
) -> None:
    data = tmp_path / "var"
    shutil.copytree(small_benchmark.path, data / "benchmarks" / small_benchmark.id)
    shutil.copytree(tiny_model_dir, data / "models" / "tiny-llava")
    env = dict(os.environ, VIGIL_DATA_DIR=str(data))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        args = list(ZERO_PORTS)
        args[args.index("--gateway-port") + 1] = str(port)
        proc = subprocess.run(
            [sys.executable, "-m", "cli.main", "up", "--once", *args],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=200,
        )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "gateway" in proc.stderr and f"{port}" in proc.stderr
    assert "Traceback" not in proc.stderr
