"""``vigil endpoint`` and ``vigil run`` against a real gateway and model server."""

from __future__ import annotations

import subprocess
import sys

from tests.stack import REPO, Stack, audit_item_ids


def vigil(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args], cwd=REPO, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


def test_register_start_watch_list(stack: Stack, small_benchmark) -> None:
    model = stack.start_model("random", "random")
    gateway = stack.start_gateway()
    g = ["--gateway", gateway.address]
    out = vigil("endpoint", "register", "baseline", model.address, "--max-concurrency", "8", *g)
    assert out.returncode == 0 and "registered baseline" in out.stdout, out.stderr
    out = vigil("endpoint", "list", *g)
    assert "baseline" in out.stdout and model.address in out.stdout
    out = vigil("run", "start", "baseline", small_benchmark.id, "--watch", *g)
    assert out.returncode == 0, out.stderr
    last = out.stdout.strip().splitlines()[-1]
    n = len(audit_item_ids(small_benchmark))
    assert "succeeded" in last and f"{n}/{n}" in last
    out = vigil("run", "list", *g)
    assert out.returncode == 0 and "succeeded" in out.stdout

    # Mistakes are one line on stderr, never a traceback.
    out = vigil("run", "start", "nope", small_benchmark.id, *g)
    assert out.returncode == 2 and "NOT_FOUND" in out.stderr and "nope" in out.stderr
    assert "Traceback" not in out.stderr
    stack.stop("gateway")
    out = vigil("endpoint", "list", *g)
    assert out.returncode == 2 and "not reachable" in out.stderr and "Traceback" not in out.stderr
