"""SIGKILL the gateway in the middle of a run; on restart the run resumes and completes with
every item recorded exactly once."""

from __future__ import annotations

import signal
import time
from collections import Counter

from tests.stack import Stack, audit_item_ids, gateway_stub, register, wait_run
from vigil.gateway.v1 import gateway_pb2 as gw


def test_gateway_sigkill_mid_run_resumes_exactly_once(stack: Stack, small_benchmark) -> None:
    bench = small_benchmark
    audit = audit_item_ids(bench)
    n = len(audit)
    model = stack.start_model("slow", "random", ["--latency-ms", "15"])
    gateway_proc = stack.start_gateway()
    gateway = gateway_stub(gateway_proc.address)
    register(gateway, "slow-random", model.address, concurrency=2)
    run_id = gateway.StartRun(
        gw.StartRunRequest(endpoint_name="slow-random", benchmark=bench.id), timeout=30
    ).run.run_id

    deadline = time.monotonic() + 60
    while True:
        done = gateway.GetRun(gw.GetRunRequest(run_id=run_id), timeout=10).run.completed_count
        if done >= n // 4:
            break
        assert time.monotonic() < deadline, "run made no progress"
        time.sleep(0.02)
    assert stack.stop("gateway", signal.SIGKILL) == -signal.SIGKILL

    restarted = stack.start_gateway(name="gateway-restarted")
    gateway = gateway_stub(restarted.address)
    before = gateway.GetRun(gw.GetRunRequest(run_id=run_id), timeout=10).run
    assert 0 < before.completed_count < n
    run = wait_run(gateway, run_id)
    assert run.state == gw.RUN_STATE_SUCCEEDED, run.error_message
    assert run.completed_count == n

    log = list(gateway.StreamResponses(gw.StreamResponsesRequest(after_seq=0), timeout=30))
    counts = Counter(e.response.item_id for e in log if e.HasField("response"))
    assert set(counts) == audit
    assert set(counts.values()) == {1}
    ends = [e.run_event for e in log if e.HasField("run_event")]
    assert [e.run.run_id for e in ends] == [run_id]
