"""The grader's data plane: follow the gateway's log, grade, store, recompute figures."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import grpc
import pandas as pd

from benchmark.store import open_benchmark
from grader.credibility import Credibility, credibility, text_only_drop
from grader.exporter import GraderExporter
from grader.figures import compute_run_figures, group_seed, run_alerts
from grader.grading import GROUP_AXES, KEY_COLUMNS, KeyItem, grade, key_from_row
from grader.regressions import compare_runs, comparison_frame, regression_alerts
from grader.settings import GraderSettings
from grader.store import DROP_COLUMNS, GRADED_COLUMNS, GraderStore, utc
from grader.token_confidence import SOURCE_AXIS, answer_token_confidence, token_figures
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


def credibility_row(run: dict[str, object], c: Credibility, final: bool) -> dict[str, object]:
    """A run's credibility as a row of the store's ``credibility`` table."""

    def end(pair: tuple[float, float], i: int) -> float | None:
        return pair[i] if c.has_interval else None

    return {
        "run_id": run["run_id"], "model_name": run["model_name"],
        "benchmark_hash": run["benchmark_hash"], "image_mode": run.get("image_mode") or "image",
        "image_count": c.image_count, "pair_count": c.pair_count, "a_count": c.a_count,
        "b_count": c.b_count, "c_count": c.c_count, "d_count": c.d_count,
        "luck_rate": c.luck_rate, "shortcut_probability": c.shortcut_probability,
        "rationality": c.rationality, "has_interval": c.has_interval,
        "luck_lower": end(c.luck_interval, 0), "luck_upper": end(c.luck_interval, 1),
        "shortcut_lower": end(c.shortcut_interval, 0),
        "shortcut_upper": end(c.shortcut_interval, 1),
        "rationality_lower": end(c.rationality_interval, 0),
        "rationality_upper": end(c.rationality_interval, 1),
        "high_level_accuracy": c.high_level_accuracy, "low_level_accuracy": c.low_level_accuracy,
        "subject_count": c.subject_count, "too_few_subjects": c.too_few_subjects, "final": final,
    }  # fmt: skip


class Grader:
    """Grades log entries in batches and keeps every run's figures current."""

    def __init__(
        self, store: GraderStore, settings: GraderSettings, exporter: GraderExporter
    ) -> None:
        self.store = store
        self.settings = settings
        self.exporter = exporter
        self._keys: dict[str, dict[str, KeyItem] | None] = {}
        self._image_paths: dict[str, dict[str, str]] = {}
        self.dirty: set[str] = set()
        # Runs that ended and await their final figures, in log order (see finalize_pending).
        self.pending: list[str] = store.unfinished_ends()
        self._finalizer: asyncio.Task[None] | None = None
        self.connected = False
        self._last_refresh = 0.0

    def answer_key(self, benchmark_id: str, benchmark_hash: str) -> dict[str, KeyItem] | None:
        if benchmark_hash not in self._keys:
            try:
                bench = open_benchmark(benchmark_id, self.settings.benchmark_root)
                if bench.content_hash != benchmark_hash:
                    raise ValueError(f"content hash {bench.content_hash} != {benchmark_hash}")
                df = bench.items(columns=[*KEY_COLUMNS, "image_path"])
                records = df.to_dict("records")
                self._keys[benchmark_hash] = {str(r["item_id"]): key_from_row(r) for r in records}
                self._image_paths[benchmark_hash] = {
                    str(r["item_id"]): str(r.get("image_path") or "") for r in records
                }
            except Exception as exc:  # noqa: BLE001 - responses are kept, marked ungraded
                log.error("no answer key for benchmark %s: %s", benchmark_id, exc)
                self._keys[benchmark_hash] = None
        return self._keys[benchmark_hash]

    def ingest(self, entries: Sequence[gw.StreamResponsesResponse]) -> None:
        """Grade and store a batch of log entries; queue runs that ended for their final
        figures (``finalize_pending``)."""
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
                        "image_mode": r.variant.image_mode or "image",
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
                        "image_mode": run.image_mode or "image",
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
            self.pending.append(str(end["run_id"]))

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
            "image_mode": r.variant.image_mode or "image",
            "gateway_outcome": outcome_name,
            "start_time": _ts(r.start_time),
            "latency_s": r.latency.ToNanoseconds() / 1e9,
        }
        if item is None:
            row.update(
                subject_id="", task="", format=r.variant.format, phrasing=r.variant.phrasing,
                is_control=False, outcome="ungraded", reason="no_answer_key", letter="",
                confidence=-1, correct=False, true_class="", pred_class="", hierarchy="",
                laterality="", image_path="", expect_abstain=False, hallucinated=-1,
                token_confidence=-1,
                **{axis: "" for axis in GROUP_AXES},
            )  # fmt: skip
            return row
        g = grade(outcome_name, r.raw_text, item)
        row.update(
            subject_id=item.subject_id, task=item.task, format=item.format,
            phrasing=item.phrasing, is_control=item.is_control, outcome=g.outcome,
            reason=g.reason, letter=g.letter, confidence=g.confidence, correct=g.correct,
            true_class=item.answer, pred_class=g.pred_class,
            hierarchy=getattr(item, "hierarchy", ""), laterality=getattr(item, "laterality", ""),
            image_path=self._image_paths.get(r.benchmark_hash, {}).get(r.item_id, ""),
            expect_abstain=bool(getattr(item, "expect_abstain", False)),
            hallucinated=int(getattr(g, "hallucinated", -1)), **item.axes,
            token_confidence=answer_token_confidence(
                [(t.token, t.logprob) for t in r.logprobs], g.letter, g.pred_class
            ) if g.outcome == "answered" else -1,
        )  # fmt: skip
        return row

    def gather(self, run_id: str, final: bool) -> FigureInputs | None:
        """Everything computing a run's figures needs, read from the store (loop thread)."""
        run = self.store.get_run(run_id)
        if run is None:
            return None
        run["end_time"] = utc(run.get("end_time"))
        run["start_time"] = utc(run.get("start_time"))
        inputs = FigureInputs(run=run, rows=self.store.run_rows(run_id), final=final)
        if final and run.get("state") == "succeeded":
            for name in ("base_run_id", "pair_run_id"):
                other_id = str(run.get(name) or "")
                other = self.store.get_run(other_id) if other_id else None
                if other is not None:
                    setattr(inputs, name.removesuffix("_id"), other)
                    inputs.other_rows[other_id] = self.store.run_rows(other_id)
        return inputs

    def write(self, run_id: str, figures: RunFigures) -> None:
        """Store computed figures (loop thread)."""
        self.store.replace_figures(
            run_id, figures.metrics, figures.bins, figures.alerts,
            credibility=figures.credibility, drops=figures.drops,
            regressions=figures.regressions, mark_final=figures.final,
        )  # fmt: skip

    def figures(self, run_id: str, final: bool) -> None:
        """Compute and store a run's figures in this thread."""
        inputs = self.gather(run_id, final)
        if inputs is not None:
            self.write(run_id, compute_figures(inputs, self.settings))

    def finalize(self, run_id: str) -> None:
        """Full figures with intervals, and alerts, for a run that ended (in this thread)."""
        t0 = time.perf_counter()
        self.figures(run_id, final=True)
        log.info("run %s graded in full (%.2f s)", run_id, time.perf_counter() - t0)

    async def finalize_pending(self) -> None:
        """Finalise the runs that ended, one at a time, computing off the event loop.

        The inputs are read and the results written on the loop thread (the store's only
        user); the bootstrap runs in a worker thread, so grading goes on meanwhile. What is
        paired with what was fixed in the store when each run ended, so the order in which
        this catches up does not change any number.
        """
        while self.pending:
            run_id = self.pending.pop(0)
            t0 = time.perf_counter()
            try:
                inputs = self.gather(run_id, final=True)
                if inputs is None:
                    continue
                figures = await asyncio.to_thread(compute_figures, inputs, self.settings)
                self.write(run_id, figures)
            except Exception:  # noqa: BLE001 - the run stays unfinished; retried on restart
                log.exception("run %s: final figures failed", run_id)
                continue
            self.exporter.refresh(self.store)
            log.info("run %s graded in full (%.2f s)", run_id, time.perf_counter() - t0)

    def kick(self) -> None:
        """Start finalising pending runs in the background unless that is already going on."""
        if self.pending and (self._finalizer is None or self._finalizer.done()):
            self._finalizer = asyncio.get_running_loop().create_task(
                self.finalize_pending(), name="finalize"
            )

    async def stop_finalizing(self) -> None:
        """Cancel background finalisation; unfinished runs are picked up on the next start."""
        if self._finalizer is not None and not self._finalizer.done():
            self._finalizer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._finalizer

    def refresh_dirty(self) -> None:
        """Point figures for in-flight runs that received responses (at most once a period)."""
        now = time.monotonic()
        if not self.dirty or now - self._last_refresh < self.settings.refresh_interval_s:
            return
        self._last_refresh = now
        dirty, self.dirty = self.dirty, set()
        for run_id in sorted(dirty):
            run = self.store.get_run(run_id)
            if run is not None and run["state"] == "running":
                self.figures(run_id, final=False)
        self.exporter.refresh(self.store)


@dataclass
class FigureInputs:
    """A run and the graded rows its figures are computed from."""

    run: dict[str, object]
    rows: pd.DataFrame
    final: bool
    base_run: dict[str, object] | None = None  # the previous run, for regressions
    pair_run: dict[str, object] | None = None  # the other image mode, for the text-only drop
    other_rows: dict[str, pd.DataFrame] = field(default_factory=dict)


@dataclass
class RunFigures:
    """What ``compute_figures`` produces for the store."""

    metrics: pd.DataFrame
    bins: pd.DataFrame
    credibility: dict[str, object]
    alerts: list[dict[str, object]]
    drops: pd.DataFrame | None
    regressions: pd.DataFrame | None
    final: bool


def compute_figures(inputs: FigureInputs, cfg: GraderSettings) -> RunFigures:
    """Every figure of one run. Pure: safe to run in a worker thread."""
    run, rows, final = inputs.run, inputs.rows, inputs.final
    run_id = str(run["run_id"])
    metrics, bins = compute_run_figures(
        rows, run_id, str(run["model_name"]),
        final=final, n_resamples=cfg.bootstrap_resamples, seed=cfg.bootstrap_seed,
        min_subjects=cfg.min_subjects,
    )  # fmt: skip
    token = token_figures(
        rows, run_id, str(run["model_name"]), final=final, n_resamples=cfg.bootstrap_resamples,
        seed=group_seed(cfg.bootstrap_seed, run_id, SOURCE_AXIS), min_subjects=cfg.min_subjects,
    )  # fmt: skip
    if not token.empty:
        metrics = pd.concat([metrics, token], ignore_index=True)
    cred = credibility(
        rows,
        n_resamples=cfg.bootstrap_resamples if final else 0,
        seed=group_seed(cfg.bootstrap_seed, run_id, "credibility"),
        min_subjects=cfg.min_subjects,
    )
    alerts: list[dict[str, object]] = []
    drops = regressions = None
    if final:
        alerts = run_alerts(rows, run, cfg.transport_error_alert_rate)
        if run.get("state") == "succeeded":
            drops = _text_only_drops(inputs, cfg)
            regressions, found = _regressions(inputs, cfg)
            alerts.extend(found)
    return RunFigures(
        metrics, bins, credibility_row(run, cred, final), alerts, drops, regressions, final
    )


def _text_only_drops(inputs: FigureInputs, cfg: GraderSettings) -> pd.DataFrame:
    """The drop of this run against the model's latest run in the other image mode."""
    run, rows, other = inputs.run, inputs.rows, inputs.pair_run
    if other is None:
        return pd.DataFrame(columns=DROP_COLUMNS)
    other_rows = inputs.other_rows[str(other["run_id"])]
    text_only = run.get("image_mode") == "text_only"
    image_run, text_run = (other, run) if text_only else (run, other)
    image_rows, text_rows = (other_rows, rows) if text_only else (rows, other_rows)
    found = text_only_drop(
        image_rows, text_rows,
        n_resamples=cfg.bootstrap_resamples,
        seed=group_seed(cfg.bootstrap_seed, str(text_run["run_id"]), "text_only_drop",
                        str(image_run["run_id"])),
        min_subjects=cfg.min_subjects,
    )  # fmt: skip
    return pd.DataFrame(
        [
            {"model_name": run["model_name"], "benchmark_hash": run["benchmark_hash"],
             "image_run_id": image_run["run_id"], "text_run_id": text_run["run_id"],
             "task": d.task, "image_accuracy": d.image_accuracy,
             "text_accuracy": d.text_accuracy, "drop": d.drop,
             "has_interval": d.has_interval, "lower": d.lower if d.has_interval else None,
             "upper": d.upper if d.has_interval else None,
             "subject_count": d.subject_count, "too_few_subjects": d.too_few_subjects}
            for d in found
        ],
        columns=DROP_COLUMNS,
    )  # fmt: skip


def _regressions(
    inputs: FigureInputs, cfg: GraderSettings
) -> tuple[pd.DataFrame | None, list[dict[str, object]]]:
    """This run against the model's previous run on the same items, and its alerts."""
    run, base = inputs.run, inputs.base_run
    if base is None:
        return None, []
    base_id = str(base["run_id"])
    comparison = compare_runs(
        inputs.other_rows[base_id], inputs.rows, base_id, str(run["run_id"]),
        n_resamples=cfg.bootstrap_resamples, seed=cfg.bootstrap_seed,
        min_subjects=cfg.min_subjects, margins=cfg.regression_margins,
        default_margin=cfg.regression_margin, alert_metrics=cfg.regression_alert_metrics,
    )  # fmt: skip
    model = str(run["model_name"])
    when = utc(run.get("end_time")) or utc(run.get("start_time"))
    return comparison_frame(comparison, model), regression_alerts(comparison, model, when)


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
    grader.kick()  # runs that ended before the last stop without their final figures
    try:
        await _follow(grader, settings, stop, backoff)
    finally:
        await grader.stop_finalizing()


async def _follow(
    grader: Grader, settings: GraderSettings, stop: asyncio.Event, backoff: float
) -> None:
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
                grader.kick()
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
