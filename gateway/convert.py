"""Protobuf <-> gateway domain types."""

from __future__ import annotations

import json
from datetime import datetime

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from gateway.domain import Endpoint, Outcome, ResponseEntry, Run, RunEndEntry, RunState
from rpc.errors import InvalidArgument
from vigil.gateway.v1 import gateway_pb2 as pb

_PROTOCOL_TO_PB = {
    "vigil": pb.PROTOCOL_VIGIL,
    "kserve_v2": pb.PROTOCOL_KSERVE_V2,
    "openai": pb.PROTOCOL_OPENAI,
}
_PROTOCOL_FROM_PB = {v: k for k, v in _PROTOCOL_TO_PB.items()}
_STATE_TO_PB = {
    RunState.PENDING: pb.RUN_STATE_PENDING,
    RunState.RUNNING: pb.RUN_STATE_RUNNING,
    RunState.SUCCEEDED: pb.RUN_STATE_SUCCEEDED,
    RunState.FAILED: pb.RUN_STATE_FAILED,
    RunState.CANCELLED: pb.RUN_STATE_CANCELLED,
}
_OUTCOME_TO_PB = {
    Outcome.OK: pb.OUTCOME_OK,
    Outcome.TIMEOUT: pb.OUTCOME_TIMEOUT,
    Outcome.TRANSPORT_ERROR: pb.OUTCOME_TRANSPORT_ERROR,
}


def timestamp(value: datetime | None) -> Timestamp | None:
    if value is None:
        return None
    ts = Timestamp()
    ts.FromDatetime(value)
    return ts


def duration(seconds: float) -> Duration:
    d = Duration()
    d.FromNanoseconds(int(round(seconds * 1e9)))
    return d


def endpoint_from_pb(msg: pb.Endpoint) -> Endpoint:
    if msg.protocol == pb.PROTOCOL_UNSPECIFIED:
        protocol = "vigil"
    elif msg.protocol in _PROTOCOL_FROM_PB:
        protocol = _PROTOCOL_FROM_PB[msg.protocol]
    else:
        raise InvalidArgument(f"endpoint.protocol {msg.protocol} is not supported")
    return Endpoint(
        name=msg.name.strip(),
        address=msg.address.strip(),
        protocol=protocol,
        schedule_interval_s=msg.schedule_interval.ToNanoseconds() / 1e9,
        schedule_benchmark=msg.schedule_benchmark,
        max_concurrency=msg.max_concurrency,
        request_timeout_s=msg.request_timeout.ToNanoseconds() / 1e9,
        model_name=msg.model_name.strip(),
        model_version=msg.model_version.strip(),
    )


def endpoint_to_pb(ep: Endpoint) -> pb.Endpoint:
    return pb.Endpoint(
        name=ep.name,
        address=ep.address,
        protocol=_PROTOCOL_TO_PB.get(ep.protocol, pb.PROTOCOL_UNSPECIFIED),
        schedule_interval=duration(ep.schedule_interval_s),
        schedule_benchmark=ep.schedule_benchmark,
        max_concurrency=ep.max_concurrency,
        request_timeout=duration(ep.request_timeout_s),
        create_time=timestamp(ep.create_time),
        model_name=ep.model_name,
        model_version=ep.model_version,
    )


def run_to_pb(run: Run) -> pb.Run:
    return pb.Run(
        run_id=run.run_id,
        endpoint_name=run.endpoint_name,
        benchmark_id=run.benchmark_id,
        benchmark_hash=run.benchmark_hash,
        state=_STATE_TO_PB[run.state],
        item_count=run.item_count,
        completed_count=run.completed_count,
        error_count=run.error_count,
        error_message=run.error_message,
        trigger=run.trigger,
        model_name=run.model_name,
        model_version=run.model_version,
        create_time=timestamp(run.create_time),
        start_time=timestamp(run.start_time),
        end_time=timestamp(run.end_time),
        image_mode=run.image_mode,
    )


def entry_to_pb(entry: ResponseEntry | RunEndEntry) -> pb.StreamResponsesResponse:
    if isinstance(entry, RunEndEntry):
        return pb.StreamResponsesResponse(
            run_event=pb.RunEvent(seq=entry.seq, run=run_to_pb(entry.run))
        )
    return pb.StreamResponsesResponse(
        response=pb.ResponseRecord(
            seq=entry.seq,
            run_id=entry.run_id,
            benchmark_id=entry.benchmark_id,
            benchmark_hash=entry.benchmark_hash,
            item_id=entry.item_id,
            variant=pb.Variant(
                format=entry.format,
                phrasing=entry.phrasing,
                option_order=entry.option_order,
                image_mode=entry.image_mode,
            ),
            endpoint_name=entry.endpoint_name,
            protocol=_PROTOCOL_TO_PB.get(entry.protocol, pb.PROTOCOL_UNSPECIFIED),
            model_name=entry.model_name,
            model_version=entry.model_version,
            request_id=entry.request_id,
            start_time=timestamp(entry.start_time),
            latency=duration(entry.latency_s),
            attempt_count=entry.attempt_count,
            outcome=_OUTCOME_TO_PB[entry.outcome],
            raw_text=entry.raw_text,
            error_message=entry.error_message,
            vigil_version=entry.vigil_version,
            model_config_digest=entry.model_config_digest,
            logprobs=[
                pb.TokenLogprob(token=t, logprob=lp)
                for t, lp in (json.loads(entry.logprobs_json) if entry.logprobs_json else [])
            ],
        )
    )
