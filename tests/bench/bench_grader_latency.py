"""Timing the grader's follow path: a response recorded by the gateway -> the grader's gauges.

Real processes (``tests.stack``): the random model server with a simulated latency, the gateway
and the grader. Two runs of the small brain-MRI suite are replayed while a thread polls the
grader's Prometheus endpoint every few milliseconds. For every response, "recorded" is its start
time plus its latency as the gateway logged them (the gateway commits right after, so this
slightly overstates the delay); its effect is the first scrape where

- ``vigil_grader_last_seq`` reaches its sequence number (graded and stored), and
- ``vigil_grader_figures_seq`` reaches it (the exported figures include it; the figures of a run
  in flight are recomputed at most once per ``refresh_interval_s``).

Target: 2 s at the 95th percentile. Run: ``.venv/bin/pytest tests/bench/bench_grader_latency.py
-q -s -m bench``.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tests.stack import Stack, gateway_stub, grader_stub, register, wait_graded, wait_run
from vigil.gateway.v1 import gateway_pb2 as gw

POLL_S = 0.01
LATENCY_MS = 40
RUNS = 2
_GAUGE = re.compile(r"^(vigil_grader_last_seq|vigil_grader_figures_seq) (\S+)$", re.MULTILINE)


def scrape(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return {name: float(value) for name, value in _GAUGE.findall(text)}


class Poller(threading.Thread):
    """Records (time, last_seq, figures_seq) at every scrape."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.samples: list[tuple[float, float, float]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                g = scrape(self.url)
                now = time.time()
                self.samples.append(
                    (now, g.get("vigil_grader_last_seq", 0), g.get("vigil_grader_figures_seq", 0))
                )
            except OSError:
                pass
            time.sleep(POLL_S)


def first_reach(samples: np.ndarray, column: int, seqs: np.ndarray) -> np.ndarray:
    """For each seq, the time of the first sample whose gauge reached it (NaN if never)."""
    reached = np.maximum.accumulate(samples[:, column])
    idx = np.searchsorted(reached, seqs, side="left")
    out = np.full(len(seqs), np.nan)
    ok = idx < len(samples)
    out[ok] = samples[idx[ok], 0]
    return out


@pytest.mark.bench
def test_bench_record_to_gauge_latency(tmp_path: Path) -> None:
    from benchmark.store import ensure_builtin

    root = tmp_path / "benchmarks"
    bench = ensure_builtin(root, "brain-mri", "small", seed=0, progress=False)
    stack = Stack(tmp_path / "stack", root)
    try:
        model = stack.start_model("random", "random", ["--latency-ms", str(LATENCY_MS)])
        gateway_proc = stack.start_gateway()
        grader_proc = stack.start_grader(gateway_proc, extra=["--bootstrap-resamples", "1000"])
        gateway = gateway_stub(gateway_proc.address)
        register(gateway, "random", model.address, concurrency=4)
        poller = Poller(f"http://127.0.0.1:{grader_proc.ports['metrics_port']}/metrics")
        poller.start()
        run_ids = []
        for _ in range(RUNS):
            run = gateway.StartRun(
                gw.StartRunRequest(endpoint_name="random", benchmark=bench.id), timeout=30
            ).run
            assert wait_run(gateway, run.run_id).state == gw.RUN_STATE_SUCCEEDED
            run_ids.append(run.run_id)
        wait_graded(grader_stub(grader_proc.address), run_ids)
        time.sleep(1.5)  # a last refresh of the exported figures
        poller.stop.set()
        poller.join()
        log = gateway.StreamResponses(gw.StreamResponsesRequest(after_seq=0), timeout=30)
        responses = [e.response for e in log if e.HasField("response")]
    finally:
        for name in ("grader", "gateway"):
            if name in stack.procs:
                stack.stop(name)
        stack.close()

    seqs = np.array([r.seq for r in responses], dtype=np.float64)
    recorded = np.array(
        [r.start_time.ToNanoseconds() / 1e9 + r.latency.ToNanoseconds() / 1e9 for r in responses]
    )
    samples = np.array(poller.samples)
    gaps = np.diff(samples[:, 0])
    print()
    print(
        f"{len(responses)} responses in {RUNS} runs, model latency {LATENCY_MS} ms, "
        f"{len(samples)} scrapes (median gap {np.median(gaps) * 1e3:.0f} ms)"
    )
    for column, name in ((1, "graded (vigil_grader_last_seq)"),
                         (2, "figures (vigil_grader_figures_seq)")):  # fmt: skip
        delay = first_reach(samples, column, seqs) - recorded
        assert not np.isnan(delay).any(), name
        p50, p95, top = np.percentile(delay, [50, 95, 100])
        print(f"record -> {name:38s} p50 {p50:6.3f} s  p95 {p95:6.3f} s  max {top:6.3f} s")
