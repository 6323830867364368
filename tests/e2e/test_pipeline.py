"""The whole path with real processes: model servers -> gateway -> DuckDB -> grader.

Two models (the random baseline and a tiny LLaVA through the real ``hf`` backend) replay the small
built-in benchmark; every item must have exactly one recorded response per run, and the grader's
figures must equal figures recomputed here from the recorded responses. Deleting the grader's
database and replaying the log from sequence 0 must reproduce every stored number.
"""

from __future__ import annotations

import math
import urllib.request
from collections import Counter

import grpc
import pandas as pd
import pytest

from grader.credibility import credibility
from grader.figures import FIGURE_AXES, VOXEL, compute_run_figures, group_seed
from grader.grading import KEY_COLUMNS, grade, key_from_row
from grader.token_confidence import SOURCE_AXIS, answer_token_confidence, token_figures
from tests.stack import Stack, gateway_stub, grader_stub, register, wait_graded, wait_run
from vigil.gateway.v1 import gateway_pb2 as gw
from vigil.grader.v1 import grader_pb2 as gr


def read_log(gateway) -> list[gw.StreamResponsesResponse]:
    return list(gateway.StreamResponses(gw.StreamResponsesRequest(after_seq=0), timeout=30))


def all_metrics(grader, run_ids: list[str]) -> dict[tuple, tuple]:
    out = {}
    for run_id in run_ids:
        for axis in ("", *FIGURE_AXES, VOXEL, SOURCE_AXIS):
            values = grader.QueryMetrics(
                gr.QueryMetricsRequest(run_id=run_id, group_axis=axis), timeout=30
            ).values
            for v in values:
                key = (v.run_id, v.task, v.format, v.group_axis, v.group_value, v.metric)
                out[key] = (v.value, v.has_interval, v.lower, v.upper, v.response_count,
                            v.subject_count, v.too_few_subjects, v.final)  # fmt: skip
    return out


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def derived(grader) -> dict[str, object]:
    """Everything the grader derives beyond metrics, as comparable plain values."""
    return {
        "credibility": [
            str(c)
            for c in grader.ListCredibility(gr.ListCredibilityRequest(), timeout=30).credibilities
        ],
        "correlation": str(
            grader.GetShortcutCorrelation(gr.GetShortcutCorrelationRequest(), timeout=30)
        ),
        "drops": str(grader.ListTextOnlyDrops(gr.ListTextOnlyDropsRequest(), timeout=30)),
        "regressions": str(grader.ListRegressions(gr.ListRegressionsRequest(), timeout=30)),
        "alerts": str(grader.ListAlerts(gr.ListAlertsRequest(), timeout=30)),
    }


def test_two_models_end_to_end(stack: Stack, small_benchmark, tiny_model_dir) -> None:
    bench = small_benchmark
    assert bench.meta.item_count >= 50
    # A run replays the audit split; items whose image is missing only go to text-only runs.
    manifest = bench.items(columns=["item_id", "split", "image_missing"])
    audit = manifest[(manifest["split"] != "train") & ~manifest["image_missing"].astype(bool)]
    items = set(audit["item_id"])
    random_model = stack.start_model("random", "random")
    hf_model = stack.start_model(
        "hf",
        "hf",
        ["--model-path", str(tiny_model_dir), "--model-name", "tiny-llava", "--torch-threads", "1"],
    )
    gateway_proc = stack.start_gateway()
    grader_proc = stack.start_grader(gateway_proc, extra=["--bootstrap-resamples", "200"])
    gateway = gateway_stub(gateway_proc.address)
    grader = grader_stub(grader_proc.address)
    register(gateway, "random-baseline", random_model.address)
    register(gateway, "tiny-llava", hf_model.address)

    run_ids = []
    for name in ("random-baseline", "tiny-llava"):
        run = gateway.StartRun(
            gw.StartRunRequest(endpoint_name=name, benchmark=bench.id), timeout=30
        ).run
        assert run.benchmark_hash == bench.content_hash
        run_ids.append(run.run_id)
    for run_id in run_ids:
        run = wait_run(gateway, run_id)
        assert run.state == gw.RUN_STATE_SUCCEEDED, run.error_message
        assert run.completed_count == run.item_count == len(items)
    wait_graded(grader, run_ids)

    # Every item exactly once per run, with provenance.
    log = read_log(gateway)
    responses = [e.response for e in log if e.HasField("response")]
    events = [e.run_event for e in log if e.HasField("run_event")]
    for run_id in run_ids:
        counts = Counter(r.item_id for r in responses if r.run_id == run_id)
        assert set(counts) == items
        assert set(counts.values()) == {1}
    assert {e.run.run_id for e in events} == set(run_ids)
    seqs = [e.response.seq if e.HasField("response") else e.run_event.seq for e in log]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    for r in responses:
        assert r.benchmark_hash == bench.content_hash and r.request_id and r.vigil_version
        assert r.model_name in ("random-baseline", "tiny-llava") and r.model_version
        assert r.start_time.seconds > 0 and r.attempt_count >= 1
        assert r.outcome == gw.OUTCOME_OK

    # The grader's figures equal figures recomputed from the recorded responses.
    key = {
        str(row["item_id"]): key_from_row(row)
        for row in bench.items(columns=KEY_COLUMNS).to_dict("records")
    }
    image_paths = dict(
        bench.items(columns=["item_id", "image_path"]).itertuples(index=False, name=None)
    )
    stored = all_metrics(grader, run_ids)
    for run_id in run_ids:
        rows = []
        for r in responses:
            if r.run_id != run_id:
                continue
            item = key[r.item_id]
            g = grade("ok", r.raw_text, item)
            rows.append(
                {"subject_id": item.subject_id, "task": item.task, "format": item.format,
                 "phrasing": item.phrasing, "outcome": g.outcome, "correct": g.correct,
                 "confidence": g.confidence, "true_class": item.answer,
                 "pred_class": g.pred_class, "hierarchy": item.hierarchy,
                 "laterality": item.laterality, "image_path": image_paths[r.item_id],
                 "expect_abstain": item.expect_abstain, "hallucinated": g.hallucinated,
                 "is_control": item.is_control, **item.axes,
                 "token_confidence": answer_token_confidence(
                     [(t.token, t.logprob) for t in r.logprobs], g.letter, g.pred_class
                 ) if g.outcome == "answered" else -1}
            )  # fmt: skip
        model = next(r.model_name for r in responses if r.run_id == run_id)
        metrics, _ = compute_run_figures(
            pd.DataFrame(rows), run_id, model, final=True, n_resamples=200, seed=0, min_subjects=5
        )
        assert len(metrics) > 0
        # The answer token's probability beside the stated confidence (backends with logprobs).
        token = token_figures(
            pd.DataFrame(rows), run_id, model, final=True, n_resamples=200,
            seed=group_seed(0, run_id, SOURCE_AXIS), min_subjects=5,
        )  # fmt: skip
        if model == "tiny-llava":
            assert len(token) > 0, "the hf backend's log-probabilities reach the grader"
            assert sum(row["token_confidence"] >= 0 for row in rows) == (
                token["response_count"].iloc[0] if len(token) else 0
            )
        else:
            assert token.empty  # the random baseline offers no log-probabilities
        metrics = pd.concat([metrics, token], ignore_index=True)
        for m in metrics.to_dict("records"):
            k = (run_id, m["task"], m["format"], m["group_axis"], m["group_value"], m["metric"])
            assert k in stored, k
            value, has_interval, lower, upper, n, subjects, too_few, final = stored[k]
            assert same(value, m["value"]), (k, value, m["value"])
            assert has_interval == m["has_interval"], k
            if has_interval:
                assert lower == m["lower"] and upper == m["upper"], k
            assert (n, subjects, too_few, final) == (
                m["response_count"],
                m["subject_count"],
                m["too_few_subjects"],
                True,
            )
        assert len([k for k in stored if k[0] == run_id]) == len(metrics)
        # Credibility (MedRCube) from the same rows, with the grader's seed.
        cred = credibility(
            pd.DataFrame(rows), n_resamples=200, seed=group_seed(0, run_id, "credibility"),
            min_subjects=5,
        )  # fmt: skip
        served = grader.ListCredibility(gr.ListCredibilityRequest(run_id=run_id), timeout=10)
        (c,) = served.credibilities
        assert (c.a_count, c.b_count, c.c_count, c.d_count, c.image_count) == (
            cred.a_count, cred.b_count, cred.c_count, cred.d_count, cred.image_count,
        )  # fmt: skip
        assert c.image_count > 0 and c.final and c.image_mode == "image"
        assert same(c.shortcut_probability, cred.shortcut_probability)
        assert same(c.luck_rate, cred.luck_rate) and same(c.rationality, cred.rationality)
        assert c.shortcut_probability_interval.has_interval == cred.has_interval
        if cred.has_interval:
            assert c.shortcut_probability_interval.lower == cred.shortcut_interval[0]

    # Headline figures carry intervals; the random baseline answers everything.
    acc = stored[(run_ids[0], "all", "all", "", "", "accuracy")]
    assert acc[1] and acc[2] <= acc[0] <= acc[3]
    assert stored[(run_ids[0], "all", "all", "", "", "coverage")][0] == 1.0

    # Reliability diagram: ten bins whose counts add up to the answered-with-confidence items.
    diagram = grader.GetReliabilityDiagram(
        gr.GetReliabilityDiagramRequest(run_id=run_ids[0]), timeout=10
    )
    assert len(diagram.bins) == 10 and diagram.model_name == "random-baseline"
    assert sum(b.count for b in diagram.bins) == len(items)

    # Prometheus: the grader exports the latest figures; the gateway its request counters.
    grader_metrics = (
        urllib.request.urlopen(
            f"http://127.0.0.1:{grader_proc.ports['metrics_port']}/metrics", timeout=10
        )
        .read()
        .decode()
    )
    assert (
        'vigil_grader_metric{metric="accuracy",model="random-baseline",task="all"}'
        in grader_metrics
    )
    assert (
        'vigil_grader_metric{metric="shortcut_probability",model="random-baseline",task="all"}'
        in grader_metrics
    )
    gateway_metrics = (
        urllib.request.urlopen(
            f"http://127.0.0.1:{gateway_proc.ports['metrics_port']}/metrics", timeout=10
        )
        .read()
        .decode()
    )
    assert 'vigil_gateway_requests_total{endpoint="tiny-llava",outcome="ok"}' in gateway_metrics

    # A second run of the baseline is compared with its first (a paired regression check), and
    # a text-only run gives the baseline's text-only drop.
    second = gateway.StartRun(
        gw.StartRunRequest(endpoint_name="random-baseline", benchmark=bench.id), timeout=30
    ).run.run_id
    assert wait_run(gateway, second).state == gw.RUN_STATE_SUCCEEDED
    text = gateway.StartRun(
        gw.StartRunRequest(endpoint_name="random-baseline", benchmark=bench.id, text_only=True),
        timeout=30,
    ).run.run_id
    assert wait_run(gateway, text).state == gw.RUN_STATE_SUCCEEDED
    wait_graded(grader, [second, text])
    runs = {r.run_id: r for r in grader.ListGradedRuns(gr.ListGradedRunsRequest(), timeout=10).runs}
    assert runs[text].image_mode == "text_only" and runs[second].image_mode == "image"
    (cmp,) = grader.ListRegressions(
        gr.ListRegressionsRequest(run_id=second), timeout=10
    ).comparisons
    assert cmp.base_run_id == run_ids[0] and cmp.model_name == "random-baseline"
    assert cmp.subject_count >= 5 and not cmp.too_few_subjects
    acc = next(d for d in cmp.differences if d.task == "all" and d.metric == "accuracy")
    assert acc.difference_interval.has_interval and acc.mcnemar.pair_count > 0
    assert acc.difference == acc.value - acc.base_value
    # The stored comparison equals one computed on demand.
    again_cmp = grader.CompareRuns(
        gr.CompareRunsRequest(base_run_id=run_ids[0], run_id=second), timeout=30
    ).comparison
    assert str(again_cmp.differences) == str(cmp.differences)
    # The text-only run is compared with nothing (no earlier text-only run) but gives the drop.
    assert not grader.ListRegressions(
        gr.ListRegressionsRequest(run_id=text), timeout=10
    ).comparisons
    drops = grader.ListTextOnlyDrops(
        gr.ListTextOnlyDropsRequest(model_name="random-baseline", latest_only=True), timeout=10
    ).drops
    pooled = next(d for d in drops if d.task == "all")
    assert (pooled.image_run_id, pooled.text_run_id) == (second, text)
    assert pooled.drop == pooled.image_accuracy - pooled.text_accuracy
    correlation = grader.GetShortcutCorrelation(gr.GetShortcutCorrelationRequest(), timeout=10)
    (corr,) = correlation.correlations
    assert corr.model_count == 2 and not corr.has_correlation  # two models: no correlation
    with pytest.raises(grpc.RpcError) as info:
        grader.CompareRuns(gr.CompareRunsRequest(base_run_id="nope", run_id=second), timeout=10)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND and "nope" in info.value.details()
    with pytest.raises(grpc.RpcError) as info:
        grader.CompareRuns(gr.CompareRunsRequest(run_id=second), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    all_runs = [*run_ids, second, text]
    stored = all_metrics(grader, all_runs)
    before = derived(grader)

    # Delete the grader's database, replay from sequence 0: identical numbers.
    stack.stop("grader")
    (stack.root / "grader.duckdb").unlink()
    replay = stack.start_grader(
        gateway_proc, name="grader2", extra=["--bootstrap-resamples", "200"]
    )
    grader2 = grader_stub(replay.address)
    wait_graded(grader2, all_runs)
    again = all_metrics(grader2, all_runs)
    assert derived(grader2) == before
    assert again.keys() == stored.keys()
    for k, v in stored.items():
        assert all(
            same(a, b) if isinstance(a, float) else a == b for a, b in zip(v, again[k], strict=True)
        ), k


def test_bad_input_is_refused_clearly(stack: Stack, small_benchmark, tmp_path) -> None:
    import shutil

    import pytest

    gateway_proc = stack.start_gateway()
    gateway = gateway_stub(gateway_proc.address)
    model = stack.start_model("random", "random")
    register(gateway, "random-baseline", model.address)

    def code_of(call) -> tuple[grpc.StatusCode, str]:
        with pytest.raises(grpc.RpcError) as info:
            call()
        return info.value.code(), info.value.details()

    code, msg = code_of(lambda: gateway.StartRun(
        gw.StartRunRequest(endpoint_name="nope", benchmark=small_benchmark.id), timeout=10))  # fmt: skip
    assert code == grpc.StatusCode.NOT_FOUND and "nope" in msg
    code, msg = code_of(lambda: gateway.StartRun(
        gw.StartRunRequest(endpoint_name="random-baseline", benchmark="no-such-suite"), timeout=10))  # fmt: skip
    assert code == grpc.StatusCode.NOT_FOUND and "no-such-suite" in msg

    # A benchmark folder that fails validation: one image corrupted on disk.
    broken = tmp_path / "broken" / small_benchmark.id
    shutil.copytree(small_benchmark.path, broken)
    victim = sorted((broken / "images").iterdir())[0]
    victim.write_bytes(b"not a png")
    code, msg = code_of(lambda: gateway.StartRun(
        gw.StartRunRequest(endpoint_name="random-baseline", benchmark=str(broken)), timeout=60))  # fmt: skip
    assert code == grpc.StatusCode.INVALID_ARGUMENT and victim.name in msg

    # A model server that is down.
    stack.stop("random")
    code, msg = code_of(lambda: gateway.StartRun(
        gw.StartRunRequest(endpoint_name="random-baseline", benchmark=small_benchmark.id), timeout=30))  # fmt: skip
    assert code == grpc.StatusCode.UNAVAILABLE and "random-baseline" in msg

    # Malformed endpoints.
    code, msg = code_of(lambda: gateway.RegisterEndpoint(
        gw.RegisterEndpointRequest(endpoint=gw.Endpoint(name="x", address="no-port")), timeout=10))  # fmt: skip
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "address" in msg
    code, msg = code_of(lambda: gateway.GetRun(gw.GetRunRequest(run_id="run-x"), timeout=10))
    assert code == grpc.StatusCode.NOT_FOUND
    assert not list(gateway.ListRuns(gw.ListRunsRequest(), timeout=10).runs)
