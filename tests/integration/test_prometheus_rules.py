"""The Prometheus files under k8s/prometheus/, checked and unit-tested by ``promtool``.

``make system-deps`` installs promtool (Debian's ``prometheus`` package). Without it these tests
fail rather than skip, so that CI can never pass them silently.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "k8s" / "prometheus"
RULES = PROM / "rules.yml"
CONFIG = PROM / "prometheus.yml"
RULE_TESTS = PROM / "rules.test.yml"

CW_EXPR = 'expr: vigil_grader_metric{metric="cw_rate",task="all"} > 0.30'


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is not installed: run `make system-deps` (Debian package prometheus)")
    return path


def run(promtool: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, *map(str, args)], capture_output=True, text=True, timeout=120, check=False
    )


def test_rules_are_valid(promtool: str) -> None:
    result = run(promtool, "check", "rules", RULES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 6 rules found" in result.stdout


def test_config_is_valid_and_its_rule_files_resolve(promtool: str) -> None:
    result = run(promtool, "check", "config", CONFIG)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout


def test_rule_unit_tests_pass(promtool: str) -> None:
    result = run(promtool, "test", "rules", RULE_TESTS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_a_broken_expression_fails_the_check(promtool: str, tmp_path: Path) -> None:
    text = RULES.read_text()
    assert CW_EXPR in text
    broken = tmp_path / "rules.yml"
    broken.write_text(text.replace(CW_EXPR, 'expr: vigil_grader_metric{metric="cw_rate" > 0.30'))
    result = run(promtool, "check", "rules", broken)
    assert result.returncode != 0
    assert "FAILED" in result.stdout + result.stderr


def test_a_missing_rule_file_fails_the_config_check(promtool: str, tmp_path: Path) -> None:
    shutil.copy(CONFIG, tmp_path / "prometheus.yml")  # without rules.yml beside it
    result = run(promtool, "check", "config", tmp_path / "prometheus.yml")
    assert result.returncode != 0


def test_the_rule_tests_catch_a_changed_threshold(promtool: str, tmp_path: Path) -> None:
    """A rule that no longer fires where the tests expect it makes `promtool test rules` fail."""
    shutil.copy(RULE_TESTS, tmp_path / "rules.test.yml")
    text = RULES.read_text()
    (tmp_path / "rules.yml").write_text(text.replace(CW_EXPR, CW_EXPR.replace("0.30", "0.50")))
    assert run(promtool, "check", "rules", tmp_path / "rules.yml").returncode == 0
    result = run(promtool, "test", "rules", tmp_path / "rules.test.yml")
    assert result.returncode != 0
    assert "VigilConfidentlyWrongHigh" in result.stdout + result.stderr
