"""The gateway against a real model server: runs, watch, cancel, the schedule, the stream."""

from __future__ import annotations

import threading
import time
import urllib.request

import grpc
from google.protobuf.duration_pb2 import Duration
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.stack import Stack, audit_item_ids, gateway_stub, register, wait_run
from vigil.gateway.v1 import gateway_pb2 as gw

TERMINAL = (gw.RUN_STATE_SUCCEEDED, gw.RUN_STATE_FAILED, gw.RUN_STATE_CANCELLED)


def test_watch_cancel_stream_and_metrics(stack: Stack, small_benchmark) -> None:
    bench = small_benchmark
    model = stack.start_model("slow", "random", ["--latency-ms", "10"])
    proc = stack.start_gateway()
    gateway = gateway_stub(proc.address)
    register(gateway, "slow", model.address, concurrency=2)

    # Health and reflection.
    with grpc.insecure_channel(proc.address) as channel:
        status = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="vigil.gateway.v1.GatewayService"), timeout=5
        )
        assert status.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = reflection.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
        )
        names = {s.name for r in replies for s in r.list_services_response.service}
        assert "vigil.gateway.v1.GatewayService" in names

    # A follower started before the run sees its entries arrive, in order.
    seen: list[int] = []
    follower = gateway.StreamResponses(gw.StreamResponsesRequest(after_seq=0, follow=True))

    def follow() -> None:
        try:
            for entry in follower:
                seen.append(
                    entry.response.seq if entry.HasField("response") else -entry.run_event.seq
                )
        except grpc.RpcError:
            pass

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()

    run = gateway.StartRun(
        gw.StartRunRequest(endpoint_name="slow", benchmark=bench.id), timeout=30
    ).run
    assert run.state in (gw.RUN_STATE_PENDING, gw.RUN_STATE_RUNNING)
    assert run.item_count == len(audit_item_ids(bench)) and run.model_name == "random-baseline"
    watched = []
    cancelled = None
    for update in gateway.WatchRun(gw.WatchRunRequest(run_id=run.run_id), timeout=60):
        watched.append(update.run.completed_count)
        if update.run.state in TERMINAL:
            break
        if update.run.completed_count >= 20 and not cancelled:
            cancelled = gateway.CancelRun(gw.CancelRunRequest(run_id=run.run_id), timeout=30).run
            assert cancelled.state == gw.RUN_STATE_CANCELLED
    assert watched == sorted(watched) and watched[-1] < len(audit_item_ids(bench))
    final = gateway.GetRun(gw.GetRunRequest(run_id=run.run_id), timeout=10).run
    assert final.state == gw.RUN_STATE_CANCELLED and final.end_time.seconds > 0
    try:
        gateway.CancelRun(gw.CancelRunRequest(run_id=run.run_id), timeout=10)
        raise AssertionError("cancelling an ended run must fail")
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION

    deadline = time.monotonic() + 10
    while not any(s < 0 for s in seen) and time.monotonic() < deadline:
        time.sleep(0.05)
    follower.cancel()
    thread.join(5)
    positions = [abs(s) for s in seen]
    assert positions == list(range(1, len(positions) + 1))
    assert seen[-1] < 0 and len(seen) == final.completed_count + 1

    # StreamResponses(after_seq) resumes from a position.
    tail = list(gateway.StreamResponses(gw.StreamResponsesRequest(after_seq=10), timeout=10))
    assert [e.response.seq for e in tail[:3]] == [11, 12, 13]

    metrics = (
        urllib.request.urlopen(f"http://127.0.0.1:{proc.ports['metrics_port']}/metrics", timeout=10)
        .read()
        .decode()
    )
    assert 'vigil_gateway_requests_total{endpoint="slow",outcome="ok"}' in metrics
    assert "vigil_gateway_request_latency_seconds_bucket" in metrics
    assert 'vigil_gateway_runs_finished_total{endpoint="slow",state="cancelled"} 1.0' in metrics


def test_interval_schedule_starts_runs(stack: Stack, small_benchmark) -> None:
    model = stack.start_model("random", "random")
    proc = stack.start_gateway()
    gateway = gateway_stub(proc.address)
    gateway.RegisterEndpoint(
        gw.RegisterEndpointRequest(
            endpoint=gw.Endpoint(
                name="scheduled", address=model.address, protocol=gw.PROTOCOL_VIGIL,
                schedule_interval=Duration(seconds=3), schedule_benchmark=small_benchmark.id,
                max_concurrency=8,
            )
        ),
        timeout=10,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while True:
        runs = gateway.ListRuns(gw.ListRunsRequest(endpoint_name="scheduled"), timeout=10).runs
        if len(runs) >= 2:
            break
        assert time.monotonic() < deadline, f"{len(runs)} scheduled runs after 60 s"
        time.sleep(0.2)
    first, second = sorted(runs, key=lambda r: r.create_time.ToNanoseconds())[:2]
    assert first.trigger == second.trigger == "schedule"
    assert second.create_time.ToNanoseconds() - first.create_time.ToNanoseconds() >= 3e9
    assert wait_run(gateway, first.run_id).state == gw.RUN_STATE_SUCCEEDED

    # A schedule needs a benchmark that exists.
    try:
        gateway.RegisterEndpoint(
            gw.RegisterEndpointRequest(
                endpoint=gw.Endpoint(
                    name="bad", address=model.address, schedule_interval=Duration(seconds=3),
                    schedule_benchmark="no-such-benchmark",
                )
            ),
            timeout=10,
        )  # fmt: skip
        raise AssertionError("expected NOT_FOUND")
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.NOT_FOUND and "no-such-benchmark" in exc.details()


def test_model_server_dying_mid_run_pauses_then_fails_the_run(
    stack: Stack, small_benchmark
) -> None:
    model = stack.start_model("dying", "random", ["--latency-ms", "10"])
    proc = stack.start_gateway(extra=["--request-timeout-s", "2", "--max-pause-s", "2"])
    gateway = gateway_stub(proc.address)
    register(gateway, "dying", model.address, concurrency=2)
    run = gateway.StartRun(
        gw.StartRunRequest(endpoint_name="dying", benchmark=small_benchmark.id), timeout=30
    ).run
    while gateway.GetRun(gw.GetRunRequest(run_id=run.run_id), timeout=10).run.completed_count < 10:
        time.sleep(0.02)
    stack.stop("dying")
    ended = wait_run(gateway, run.run_id, timeout_s=120)
    assert ended.state == gw.RUN_STATE_FAILED
    assert "not ready for 2 s" in ended.error_message, ended.error_message
    # Items asked while the endpoint was away were not recorded as errors: the run paused. Only
    # the requests in flight at the moment the server shut down (at most the concurrency, 2) may
    # have failed, as the server cancelled them (recorded: errors are data).
    log = list(gateway.StreamResponses(gw.StreamResponsesRequest(after_seq=0), timeout=10))
    responses = [e.response for e in log if e.HasField("response")]
    outcomes = [r.outcome for r in responses]
    errors = [r.error_message for r in responses if r.outcome != gw.OUTCOME_OK]
    assert outcomes.count(gw.OUTCOME_OK) >= len(outcomes) - 2, errors
    assert all(e.startswith(("CANCELLED", "UNAVAILABLE")) for e in errors), errors
    assert ended.completed_count == len(outcomes) < len(audit_item_ids(small_benchmark))


def test_run_pauses_while_endpoint_is_down_and_resumes(stack: Stack, small_benchmark) -> None:
    bench = small_benchmark
    model = stack.start_model("flaky", "random", ["--latency-ms", "5"])
    port = model.ports["grpc_port"]
    proc = stack.start_gateway(extra=["--max-pause-s", "60"])
    gateway = gateway_stub(proc.address)
    register(gateway, "flaky", model.address, concurrency=2)
    run = gateway.StartRun(
        gw.StartRunRequest(endpoint_name="flaky", benchmark=bench.id), timeout=30
    ).run
    while gateway.GetRun(gw.GetRunRequest(run_id=run.run_id), timeout=10).run.completed_count < 20:
        time.sleep(0.02)
    stack.stop("flaky")
    time.sleep(2.0)
    paused = gateway.GetRun(gw.GetRunRequest(run_id=run.run_id), timeout=10).run
    assert paused.state == gw.RUN_STATE_RUNNING and paused.completed_count < len(
        audit_item_ids(bench)
    )
    # The same endpoint comes back on the same address.
    stack.start_model("flaky-again", "random", port=port)
    ended = wait_run(gateway, run.run_id, timeout_s=120)
    assert ended.state == gw.RUN_STATE_SUCCEEDED, ended.error_message
    # Only requests in flight when the server shut down may have failed (cancelled by it).
    assert ended.completed_count == len(audit_item_ids(bench)) and ended.error_count <= 2
    log = list(gateway.StreamResponses(gw.StreamResponsesRequest(after_seq=0), timeout=10))
    items = [e.response.item_id for e in log if e.HasField("response")]
    assert len(items) == len(set(items)) == len(audit_item_ids(bench))
    retried = [e.response for e in log if e.HasField("response") and e.response.attempt_count > 1]
    assert retried, "the items asked while the endpoint was down were retried"


def test_text_only_run_sends_no_image(stack: Stack, small_benchmark) -> None:
    model = stack.start_model("random", "random")
    proc = stack.start_gateway()
    gateway = gateway_stub(proc.address)
    register(gateway, "random", model.address, concurrency=8)
    run = gateway.StartRun(
        gw.StartRunRequest(endpoint_name="random", benchmark=small_benchmark.id, text_only=True),
        timeout=30,
    ).run
    assert run.image_mode == "text_only"
    assert wait_run(gateway, run.run_id).state == gw.RUN_STATE_SUCCEEDED
    log = list(gateway.StreamResponses(gw.StreamResponsesRequest(after_seq=0), timeout=10))
    modes = {e.response.variant.image_mode for e in log if e.HasField("response")}
    assert modes == {"text_only"}
