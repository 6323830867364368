"""The grader's data plane: follow the gateway's log, grade, store, recompute figures."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from datetime import UTC, datetime

import grpc
import pandas as pd

from benchmark.store import open_benchmark
from grader.exporter import GraderExporter
from grader.figures import compute_run_figures, run_alerts
from grader.grading import GROUP_AXES, KEY_COLUMNS, KeyItem, grade, key_from_row
from grader.settings import GraderSettings
from grader.store import GRADED_COLUMNS, GraderStore, utc
from rpc.client import aio_channel
from vigil.gateway.v1 import gateway_pb2 as gw
from vigil.gateway.v1 import gateway_pb2_grpc

log = logging.getLogger(__name__)

BATCH = 1000
LULL_S = 0.05
_STATE_NAMES = {
    gw.RUN_STATE_SUCCEEDED: "succeeded",
    gw.RUN_STATE_FAILED: "failed",
    gw.RUN_STATE_CANCELLED: "cancelled",
    gw.RUN_STATE_RUNNING: "running",
    gw.RUN_STATE_PENDING: "pending",
}


def _ts(msg: object) -> datetime | None:
    if msg is None or not msg.seconds and not msg.nanos:  # type: ignore[attr-defined]
        return None
    return msg.ToDatetime(tzinfo=UTC)  # type: ignore[attr-defined,no-any-return]


class Grader:
    """Grades log entries in batches and keeps every run's figures current."""

    def __init__(
        self, store: GraderStore, settings: GraderSettings, exporter: GraderExporter
    ) -> None:
        self.store = store
        self.settings = settings
        self.exporter = exporter
        self._keys: dict[str, dict[str, KeyItem] | None] = {}
        self.dirty: set[str] = set()
        self.connected = False
        self._last_refresh = 0.0

    def answer_key(self, benchmark_id: str, benchmark_hash: str) -> dict[str, KeyItem] | None:
        if benchmark_hash not in self._keys:
            try:
                bench = open_benchmark(benchmark_id, self.settings.benchmark_root)
                if bench.content_hash != benchmark_hash:
                    raise ValueError(f"content hash {bench.content_hash} != {benchmark_hash}")
                df = bench.items(columns=KEY_COLUMNS)
                self._keys[benchmark_hash] = {
                    str(r["item_id"]): key_from_row(r) for r in df.to_dict("records")
                }
            except Exception as exc:  # noqa: BLE001 - responses are kept, marked ungraded
                log.error("no answer key for benchmark %s: %s", benchmark_id, exc)
                self._keys[benchmark_hash] = None
        return self._keys[benchmark_hash]

    def ingest(self, entries: Sequence[gw.StreamResponsesResponse]) -> None:
        """Grade and store a batch of log entries; finalise runs that ended."""
        if not entries:
            return
        graded: list[dict[str, object]] = []
        runs_seen: dict[str, dict[str, object]] = {}
        run_ends: list[dict[str, object]] = []
        last_seq = self.store.last_seq
        for entry in entries:
            if entry.HasField("response"):
                r = entry.response
                last_seq = r.seq
                graded.append(self._grade(r))
                runs_seen.setdefault(
                    r.run_id,
                    {
                        "run_id": r.run_id,
                        "model_name": r.model_name,
                        "model_version": r.model_version,
                        "endpoint_name": r.endpoint_name,
                        "benchmark_id": r.benchmark_id,
                        "benchmark_hash": r.benchmark_hash,
                        "start_time": _ts(r.start_time),
                    },
                )
            elif entry.HasField("run_event"):
                ev = entry.run_event
                last_seq = ev.seq
                run = ev.run
                run_ends.append(
                    {
                        "run_id": run.run_id,
                        "model_name": run.model_name,
                        "model_version": run.model_version,
                        "endpoint_name": run.endpoint_name,
                        "benchmark_id": run.benchmark_id,
                        "benchmark_hash": run.benchmark_hash,
                        "state": _STATE_NAMES.get(run.state, "unknown"),
                        "start_time": _ts(run.start_time) or _ts(run.create_time),
                        "end_time": _ts(run.end_time),
                    }
                )
        df = pd.DataFrame(graded, columns=GRADED_COLUMNS)
        if len(df):
            df["start_time"] = pd.to_datetime(df["start_time"], utc=True)
        self.store.apply_batch(df, list(runs_seen.values()), run_ends, last_seq)
        self.exporter.graded.inc(len(graded))
        self.exporter.last_seq.set(last_seq)
        if graded:
            newest = graded[-1]
            start = newest["start_time"]
            assert isinstance(start, datetime)
            recorded = start.timestamp() + float(str(newest["latency_s"]))
            self.exporter.lag.set(max(0.0, time.time() - recorded))
        self.dirty.update(runs_seen)
        for end in run_ends:
            self.dirty.discard(str(end["run_id"]))
            self.finalize(str(end["run_id"]))
        if run_ends:
            self.exporter.refresh(self.store)

    def _grade(self, r: gw.ResponseRecord) -> dict[str, object]:
        key = self.answer_key(r.benchmark_id, r.benchmark_hash)
        item = key.get(r.item_id) if key else None
        outcome_name = {gw.OUTCOME_OK: "ok", gw.OUTCOME_TIMEOUT: "timeout"}.get(
            r.outcome, "transport_error"
        )
        row: dict[str, object] = {
            "seq": r.seq,
            "run_id": r.run_id,
            "model_name": r.model_name,
            "model_version": r.model_version,
            "endpoint_name": r.endpoint_name,
            "benchmark_id": r.benchmark_id,
            "benchmark_hash": r.benchmark_hash,
            "item_id": r.item_id,
            "image_mode": r.variant.image_mode,
            "gateway_outcome": outcome_name,
            "start_time": _ts(r.start_time),
            "latency_s": r.latency.ToNanoseconds() / 1e9,
        }
        if item is None:
            row.update(
                subject_id="", task="", format=r.variant.format, phrasing=r.variant.phrasing,
                is_control=False, outcome="ungraded", reason="no_answer_key", letter="",
                confidence=-1, correct=False, true_class="", pred_class="",
                **{axis: "" for axis in GROUP_AXES},
            )  # fmt: skip
            return row
        g = grade(outcome_name, r.raw_text, item)
        row.update(
            subject_id=item.subject_id, task=item.task, format=item.format,
            phrasing=item.phrasing, is_control=item.is_control, outcome=g.outcome,
            reason=g.reason, letter=g.letter, confidence=g.confidence, correct=g.correct,
            true_class=item.answer, pred_class=g.pred_class, **item.axes,
        )  # fmt: skip
        return row

    def figures(self, run_id: str, final: bool) -> None:
        run = self.store.get_run(run_id)
        if run is None:
            return
        rows = self.store.run_rows(run_id)
        metrics, bins = compute_run_figures(
            rows,
            run_id,
            str(run["model_name"]),
            final=final,
            n_resamples=self.settings.bootstrap_resamples,
            seed=self.settings.bootstrap_seed,
            min_subjects=self.settings.min_subjects,
        )
        alerts = []
        if final:
            run["end_time"] = utc(run.get("end_time"))
            run["start_time"] = utc(run.get("start_time"))
            alerts = run_alerts(rows, run, self.settings.transport_error_alert_rate)
        self.store.replace_figures(run_id, metrics, bins, alerts)

    def finalize(self, run_id: str) -> None:
        """Full figures with intervals, and alerts, for a run that ended."""
        t0 = time.perf_counter()
        self.figures(run_id, final=True)
        log.info("run %s graded in full (%.2f s)", run_id, time.perf_counter() - t0)

    def refresh_dirty(self) -> None:
        """Point figures for in-flight runs that received responses (at most once a period)."""
        now = time.monotonic()
        if not self.dirty or now - self._last_refresh < self.settings.refresh_interval_s:
            return
        self._last_refresh = now
        dirty, self.dirty = self.dirty, set()
        for run_id in sorted(dirty):
            run = self.store.get_run(run_id)
            if run is not None and not run["final"]:
                self.figures(run_id, final=False)
        self.exporter.refresh(self.store)


async def _read(
    call: grpc.aio.UnaryStreamCall,  # type: ignore[type-arg]
    queue: asyncio.Queue[gw.StreamResponsesResponse | None],
) -> None:
    try:
        async for entry in call:
            await queue.put(entry)
    finally:
        with contextlib.suppress(asyncio.QueueFull):
            queue.put_nowait(None)


async def follow(grader: Grader, settings: GraderSettings, stop: asyncio.Event) -> None:
    """Follow the gateway's log from the stored position, reconnecting until ``stop``."""
    backoff = 0.5
    while not stop.is_set():
        channel = aio_channel(settings.gateway_address)
        try:
            stub = gateway_pb2_grpc.GatewayServiceStub(channel)
            call = stub.StreamResponses(
                gw.StreamResponsesRequest(after_seq=grader.store.last_seq, follow=True)
            )
            queue: asyncio.Queue[gw.StreamResponsesResponse | None] = asyncio.Queue(
                maxsize=10 * BATCH
            )

            await call.wait_for_connection()
            reader_task = asyncio.create_task(_read(call, queue))
            grader.connected = True
            grader.exporter.connected.set(1)
            backoff = 0.5
            ended = False
            while not ended and not stop.is_set():
                try:
                    first = await asyncio.wait_for(queue.get(), settings.refresh_interval_s)
                except TimeoutError:
                    grader.refresh_dirty()
                    if reader_task.done() and queue.empty():
                        break
                    continue
                if first is None:
                    break
                batch = [first]
                deadline = time.monotonic() + LULL_S
                while len(batch) < BATCH:
                    try:
                        nxt = (
                            queue.get_nowait()
                            if time.monotonic() > deadline
                            else await asyncio.wait_for(
                                queue.get(), max(0.0, deadline - time.monotonic())
                            )
                        )
                    except (TimeoutError, asyncio.QueueEmpty):
                        break
                    if nxt is None:
                        ended = True
                        break
                    batch.append(nxt)
                grader.ingest(batch)
                if queue.empty():
                    grader.refresh_dirty()
            reader_task.cancel()
            try:
                await reader_task
            except (asyncio.CancelledError, grpc.aio.AioRpcError):
                pass
        except grpc.aio.AioRpcError as exc:
            log.warning("gateway stream at %s: %s", settings.gateway_address, exc.code().name)
        finally:
            grader.connected = False
            grader.exporter.connected.set(0)
            await channel.close()
        if not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), backoff)
            except TimeoutError:
                pass
            backoff = min(backoff * 2, 5.0)
