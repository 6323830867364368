"""``GatewayService``: converts protobuf to domain calls on the run manager and back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from gateway import convert
from gateway.runs import RunManager
from rpc.errors import InvalidArgument
from vigil.gateway.v1 import gateway_pb2 as pb
from vigil.gateway.v1 import gateway_pb2_grpc

STREAM_BATCH = 1000
POLL_S = 1.0


class GatewayServicer(gateway_pb2_grpc.GatewayServiceServicer):
    def __init__(self, runs: RunManager) -> None:
        self.runs = runs
        self.stopping = False

    async def stop_streams(self) -> None:
        """End WatchRun and following StreamResponses calls so that a stop need not wait."""
        self.stopping = True
        await self.runs.recorder.notify()

    async def RegisterEndpoint(
        self, request: pb.RegisterEndpointRequest, context: grpc.aio.ServicerContext
    ) -> pb.RegisterEndpointResponse:
        if not request.HasField("endpoint"):
            raise InvalidArgument("endpoint is required")
        ep = self.runs.register_endpoint(convert.endpoint_from_pb(request.endpoint))
        return pb.RegisterEndpointResponse(endpoint=convert.endpoint_to_pb(ep))

    async def ListEndpoints(
        self, request: pb.ListEndpointsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListEndpointsResponse:
        eps = self.runs.store.list_endpoints()
        return pb.ListEndpointsResponse(endpoints=[convert.endpoint_to_pb(e) for e in eps])

    async def StartRun(
        self, request: pb.StartRunRequest, context: grpc.aio.ServicerContext
    ) -> pb.StartRunResponse:
        if not request.endpoint_name:
            raise InvalidArgument("endpoint_name is required")
        run = await self.runs.start_run(
            request.endpoint_name, request.benchmark, text_only=request.text_only
        )
        return pb.StartRunResponse(run=convert.run_to_pb(run))

    async def GetRun(
        self, request: pb.GetRunRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetRunResponse:
        return pb.GetRunResponse(run=convert.run_to_pb(self.runs.run(request.run_id)))

    async def ListRuns(
        self, request: pb.ListRunsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListRunsResponse:
        if request.page_size < 0:
            raise InvalidArgument("page_size must not be negative")
        runs = self.runs.store.list_runs(request.endpoint_name, request.page_size or 100)
        return pb.ListRunsResponse(runs=[convert.run_to_pb(r) for r in runs])

    async def CancelRun(
        self, request: pb.CancelRunRequest, context: grpc.aio.ServicerContext
    ) -> pb.CancelRunResponse:
        run = await self.runs.cancel_run(request.run_id)
        return pb.CancelRunResponse(run=convert.run_to_pb(run))

    async def WatchRun(
        self, request: pb.WatchRunRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.WatchRunResponse]:
        run = self.runs.run(request.run_id)
        last = None
        changed = self.runs.recorder.changed
        while True:
            key = (run.state, run.completed_count)
            if key != last:
                last = key
                yield pb.WatchRunResponse(run=convert.run_to_pb(run))
            if run.state.terminal or self.stopping:
                return
            async with changed:
                try:
                    await asyncio.wait_for(changed.wait(), POLL_S)
                except TimeoutError:
                    pass
            run = self.runs.run(request.run_id)

    async def StreamResponses(
        self, request: pb.StreamResponsesRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.StreamResponsesResponse]:
        if request.after_seq < 0:
            raise InvalidArgument("after_seq must not be negative")
        after = request.after_seq
        store = self.runs.store
        await context.send_initial_metadata(())
        changed = self.runs.recorder.changed
        while True:
            entries = store.read_log(after, STREAM_BATCH)
            for entry in entries:
                yield convert.entry_to_pb(entry)
                after = entry.seq
            if len(entries) == STREAM_BATCH:
                continue
            if not request.follow or self.stopping:
                return
            async with changed:
                if store.last_seq > after:
                    continue
                try:
                    await asyncio.wait_for(changed.wait(), POLL_S)
                except TimeoutError:
                    pass
