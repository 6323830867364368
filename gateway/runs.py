"""Runs: replay every item of a benchmark against one endpoint, record every response.

A run survives a crash: on restart, unfinished runs resume and replay only the items that have
no committed response, so no item is lost and none is recorded twice (the log also refuses a
second response for the same run and item).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

from benchmark import format as bench_format
from benchmark.errors import BenchmarkInvalid
from benchmark.store import Benchmark, open_benchmark
from benchmark.validate import validate_benchmark
from cli.version import VIGIL_VERSION
from gateway.adapters import (
    ADAPTERS,
    AdapterError,
    AdapterTarget,
    ModelAdapter,
    ModelIdentity,
    create_adapter,
)
from gateway.domain import Endpoint, Outcome, ResponseEntry, Run, RunEndEntry, RunState
from gateway.metrics import GatewayMetrics
from gateway.recorder import Recorder
from gateway.settings import GatewaySettings
from gateway.store import GatewayStore
from rpc.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable

log = logging.getLogger(__name__)

ITEM_COLUMNS = [
    "item_id",
    "image_path",
    "media_type",
    "prompt",
    "format",
    "phrasing",
    "option_order",
]
# Selection columns of newer benchmark formats: train items are never replayed, and items whose
# image is missing are only sent in text-only runs.
SELECTION_COLUMNS = ("split", "image_missing")


def replay_items(bench: Benchmark, text_only: bool) -> pd.DataFrame:
    """The items a run replays, in item-id order."""
    extra = [c for c in SELECTION_COLUMNS if c in bench_format.COLUMNS]
    items = bench.items(columns=ITEM_COLUMNS + extra)
    if "split" in items.columns:
        items = items[items["split"] != "train"]
    if "image_missing" in items.columns and not text_only:
        items = items[~items["image_missing"].astype(bool)]
    return items.sort_values("item_id").reset_index(drop=True)


def target_of(ep: Endpoint) -> AdapterTarget:
    return AdapterTarget(ep.address, ep.model_name, ep.model_version)


class RunFailed(Exception):
    """A run cannot go on; the message says why."""


class EndpointGate:
    """Pauses every worker of a run while its endpoint is not ready, and resumes them together."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.open.set()
        self._lock = asyncio.Lock()
        self.pauses = 0

    async def pause_until_ready(
        self, is_ready: Callable[[], Awaitable[bool]], max_pause_s: float
    ) -> None:
        async with self._lock:
            if await is_ready():
                return
            self.open.clear()
            self.pauses += 1
            deadline = time.monotonic() + max_pause_s
            try:
                while not await is_ready():
                    if time.monotonic() > deadline:
                        raise RunFailed(f"the endpoint was not ready for {max_pause_s:.0f} s")
                    await asyncio.sleep(1.0)
            finally:
                self.open.set()


def new_run_id(now: datetime) -> str:
    return f"run-{now.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"


class RunManager:
    """Starts, resumes, cancels and schedules runs; owns their tasks."""

    def __init__(
        self,
        store: GatewayStore,
        recorder: Recorder,
        settings: GatewaySettings,
        metrics: GatewayMetrics,
    ) -> None:
        self.store = store
        self.recorder = recorder
        self.settings = settings
        self.metrics = metrics
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self._cancel_requested: set[str] = set()
        self._validated: set[str] = set()
        self._schedule_failures: dict[str, float] = {}
        self._scheduler: asyncio.Task[None] | None = None
        self._task_endpoint: dict[str, str] = {}

    # Lookups ---------------------------------------------------------------------------------

    def endpoint(self, name: str) -> Endpoint:
        ep = self.store.get_endpoint(name)
        if ep is None:
            known = ", ".join(e.name for e in self.store.list_endpoints()) or "none registered"
            raise NotFound(f"unknown endpoint {name!r} (known: {known})")
        return ep

    def run(self, run_id: str) -> Run:
        run = self.store.get_run(run_id)
        if run is None:
            raise NotFound(f"unknown run {run_id!r}")
        return run

    def open_validated(self, ref: str) -> Benchmark:
        """Resolve a benchmark reference and validate it once per content hash."""
        if not ref:
            raise InvalidArgument("benchmark: a name, id or path is required")
        bench = open_benchmark(ref, self.settings.benchmark_root)
        if bench.content_hash not in self._validated:
            problems = validate_benchmark(bench.path)
            if problems:
                raise BenchmarkInvalid(str(bench.path), problems)
            self._validated.add(bench.content_hash)
        return bench

    def register_endpoint(self, ep: Endpoint) -> Endpoint:
        if not ep.name:
            raise InvalidArgument("endpoint.name is required")
        if not ep.address or ":" not in ep.address:
            raise InvalidArgument(f"endpoint.address must be host:port, got {ep.address!r}")
        if ep.protocol not in ADAPTERS:
            known = ", ".join(sorted(ADAPTERS))
            raise InvalidArgument(
                f"endpoint.protocol {ep.protocol!r} is not supported (known: {known})"
            )
        if ep.protocol != "vigil" and not ep.model_name:
            raise InvalidArgument(f"endpoint.model_name is required for protocol {ep.protocol!r}")
        if ep.schedule_interval_s < 0:
            raise InvalidArgument("endpoint.schedule_interval must not be negative")
        if ep.schedule_interval_s > 0 and not ep.schedule_benchmark:
            raise InvalidArgument("endpoint.schedule_benchmark is required with a schedule")
        if ep.max_concurrency < 0 or ep.request_timeout_s < 0:
            raise InvalidArgument("endpoint.max_concurrency and request_timeout must be >= 0")
        if ep.schedule_benchmark:
            open_benchmark(ep.schedule_benchmark, self.settings.benchmark_root)
        return self.store.upsert_endpoint(ep)

    # Lifecycle -------------------------------------------------------------------------------

    async def start_run(
        self,
        endpoint_name: str,
        benchmark_ref: str,
        trigger: str = "manual",
        text_only: bool = False,
    ) -> Run:
        ep = self.endpoint(endpoint_name)
        bench = self.open_validated(benchmark_ref)
        item_count = len(replay_items(bench, text_only))
        if item_count == 0:
            raise InvalidArgument(f"benchmark {bench.id} has no items to replay")
        adapter = create_adapter(ep.protocol, target_of(ep))
        try:
            identity = await self._describe(adapter, ep)
        finally:
            await adapter.close()
        now = datetime.now(UTC)
        run = Run(
            run_id=new_run_id(now),
            endpoint_name=ep.name,
            benchmark_id=bench.id,
            benchmark_hash=bench.content_hash,
            benchmark_path=str(bench.path.resolve()),
            state=RunState.PENDING,
            item_count=item_count,
            trigger=trigger,
            create_time=now,
            image_mode="text_only" if text_only else "image",
            model_name=identity.model_name,
            model_version=identity.model_version,
        )
        self.store.insert_run(run)
        log.info("run %s: %s on %s (%d items)", run.run_id, bench.id, ep.name, run.item_count)
        self._spawn(run)
        return run

    async def _describe(self, adapter: ModelAdapter, ep: Endpoint) -> ModelIdentity:
        try:
            identity = await adapter.describe(self.settings.describe_timeout_s)
        except AdapterError as exc:
            raise Unavailable(
                f"endpoint {ep.name!r} at {ep.address} is not answering: {exc.message}"
            ) from None
        if not identity.ready:
            raise Unavailable(f"endpoint {ep.name!r} at {ep.address} is not ready yet")
        return identity

    def _spawn(self, run: Run) -> None:
        task = asyncio.create_task(self._execute(run), name=f"run {run.run_id}")
        self.tasks[run.run_id] = task
        self._task_endpoint[run.run_id] = run.endpoint_name
        run_id = run.run_id
        task.add_done_callback(lambda _t: self._forget(run_id))
        self.metrics.active_runs.set(len(self.tasks))

    def _forget(self, run_id: str) -> None:
        self.tasks.pop(run_id, None)
        self._task_endpoint.pop(run_id, None)
        self.metrics.active_runs.set(len(self.tasks))

    async def cancel_run(self, run_id: str) -> Run:
        run = self.run(run_id)
        if run.state.terminal:
            raise FailedPrecondition(f"run {run_id!r} has already ended ({run.state.value})")
        task = self.tasks.get(run_id)
        if task is not None:
            self._cancel_requested.add(run_id)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        else:
            await self._finish(run, RunState.CANCELLED, "")
        return self.run(run_id)

    async def resume(self) -> None:
        """Restart the runs that a crash or a stop left unfinished."""
        for run in self.store.unfinished_runs():
            log.info(
                "resuming run %s (%d/%d recorded)", run.run_id, run.completed_count, run.item_count
            )
            self._spawn(run)

    async def shutdown(self) -> None:
        """Stop replaying; unfinished runs stay unfinished and resume at the next start."""
        if self._scheduler:
            self._scheduler.cancel()
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.recorder.stop()

    # Replay ----------------------------------------------------------------------------------

    async def _execute(self, run: Run) -> None:
        adapter: ModelAdapter | None = None
        try:
            ep = self.endpoint(run.endpoint_name)
            bench = open_benchmark(Path(run.benchmark_path), self.settings.benchmark_root)
            if bench.content_hash != run.benchmark_hash:
                raise RunFailed(f"benchmark {run.benchmark_path} changed since the run started")
            items = replay_items(bench, run.image_mode == "text_only")
            done = self.store.recorded_item_ids(run.run_id)
            pending = items[~items["item_id"].isin(done)]
            adapter = create_adapter(ep.protocol, target_of(ep))
            identity = await self._wait_ready(adapter, ep)
            if run.state is RunState.PENDING or run.start_time is None:
                run.start_time = datetime.now(UTC)
            run.state = RunState.RUNNING
            run.model_name, run.model_version = identity.model_name, identity.model_version
            await self.recorder.commit(None, run)
            self.metrics.run_total.labels(ep.name).set(run.item_count)
            self.metrics.run_completed.labels(ep.name).set(len(done))
            await self._replay(run, ep, bench, pending, adapter, len(done))
            await self.recorder.flush()
            await self._finish(run, RunState.SUCCEEDED, "")
        except asyncio.CancelledError:
            if run.run_id in self._cancel_requested:
                self._cancel_requested.discard(run.run_id)
                await self._finish(run, RunState.CANCELLED, "cancelled")
            raise
        except (RunFailed, NotFound, BenchmarkInvalid) as exc:
            log.warning("run %s failed: %s", run.run_id, exc)
            await self._finish(run, RunState.FAILED, str(exc))
        except Exception as exc:  # noqa: BLE001 - a run must always end in a state
            log.exception("run %s failed unexpectedly", run.run_id)
            await self._finish(run, RunState.FAILED, f"internal error: {type(exc).__name__}")
        finally:
            if adapter is not None:
                await adapter.close()

    async def _wait_ready(self, adapter: ModelAdapter, ep: Endpoint) -> ModelIdentity:
        """Wait for the endpoint (after a restart it may still be loading), then give up."""
        deadline = time.monotonic() + max(self._timeout(ep), 30.0)
        while True:
            try:
                return await self._describe(adapter, ep)
            except Unavailable as exc:
                if time.monotonic() > deadline:
                    raise RunFailed(exc.message) from None
                await asyncio.sleep(1.0)

    def _timeout(self, ep: Endpoint) -> float:
        return ep.request_timeout_s or self.settings.request_timeout_s

    async def _replay(
        self,
        run: Run,
        ep: Endpoint,
        bench: Benchmark,
        pending: pd.DataFrame,
        adapter: ModelAdapter,
        already: int,
    ) -> None:
        concurrency = ep.max_concurrency or self.settings.max_concurrency
        timeout_s = self._timeout(ep)
        images: dict[str, bytes] = {}
        rows: Iterator[tuple[object, ...]] = pending.itertuples(index=False, name=None)
        completed = already
        stored = self.store.get_run(run.run_id)
        errors = stored.error_count if stored is not None else 0
        consecutive_errors = 0
        failure: list[str] = []
        cols = {name: i for i, name in enumerate(pending.columns)}
        gate = EndpointGate()
        text_only = run.image_mode == "text_only"

        async def is_ready() -> bool:
            try:
                return (await adapter.describe(self.settings.describe_timeout_s)).ready
            except AdapterError:
                return False

        async def worker() -> None:
            nonlocal completed, consecutive_errors, errors
            for row in rows:
                if failure:
                    return
                item_id = str(row[cols["item_id"]])
                image_path = str(row[cols["image_path"]])
                payload: list[tuple[bytes, str]] = []
                if image_path and not text_only:
                    if image_path not in images:
                        images[image_path] = bench.read_image(image_path)
                    payload.append((images[image_path], str(row[cols["media_type"]])))
                earlier: tuple[tuple[int, datetime, float, str, str], ...] = ()
                while True:
                    await gate.open.wait()
                    entry, retryable, last = await self._ask(
                        run, ep, adapter, item_id, str(row[cols["prompt"]]), payload, timeout_s,
                        str(row[cols["format"]]), str(row[cols["phrasing"]]),
                        str(row[cols["option_order"]]), earlier,
                    )  # fmt: skip
                    if not retryable or await is_ready():
                        break
                    earlier = (*entry.failed_attempts, last)
                    # The endpoint went away: pause the run, then ask this item again.
                    log.warning("run %s: endpoint %s not ready; pausing", run.run_id, ep.name)
                    try:
                        await gate.pause_until_ready(is_ready, self.settings.max_pause_s)
                    except RunFailed as exc:
                        failure.append(str(exc))
                        return
                    log.info("run %s: endpoint %s ready again; resuming", run.run_id, ep.name)
                self.recorder.record(entry)
                completed += 1
                self.metrics.run_completed.labels(ep.name).set(completed)
                if entry.outcome is Outcome.OK:
                    consecutive_errors = 0
                    continue
                consecutive_errors += 1
                errors += 1
                if consecutive_errors >= self.settings.max_consecutive_errors:
                    failure.append(
                        f"{consecutive_errors} requests in a row failed; last: {entry.error_message}"
                    )
                    return
                if (
                    completed >= self.settings.error_budget_min_items
                    and errors / completed > self.settings.error_budget
                ):
                    failure.append(
                        f"error budget exceeded: {errors} of {completed} requests failed"
                        f" (budget {self.settings.error_budget:.0%}); last: {entry.error_message}"
                    )
                    return

        await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
        if failure:
            await self.recorder.flush()
            raise RunFailed(failure[0])

    async def _ask(
        self,
        run: Run,
        ep: Endpoint,
        adapter: ModelAdapter,
        item_id: str,
        prompt: str,
        images: list[tuple[bytes, str]],
        timeout_s: float,
        fmt: str,
        phrasing: str,
        option_order: str,
        earlier: tuple[tuple[int, datetime, float, str, str], ...] = (),
    ) -> tuple[ResponseEntry, bool, tuple[int, datetime, float, str, str]]:
        """Ask one item, retrying UNAVAILABLE and RESOURCE_EXHAUSTED with backoff.

        Returns the entry to record, whether it failed with a retryable error, and its last
        attempt as (attempt, start, latency_s, outcome, error).
        """
        request_id = uuid.uuid4().hex
        start = earlier[0][1] if earlier else datetime.now(UTC)
        t0 = time.perf_counter() - sum(a[2] for a in earlier)
        outcome, text, error, digest, logprobs = Outcome.OK, "", "", "", ""
        model_name, model_version = run.model_name, run.model_version
        failed = list(earlier)
        attempt = len(earlier)
        retryable = False
        while True:
            attempt += 1
            a_start, a_t0 = datetime.now(UTC), time.perf_counter()
            try:
                reply = await adapter.generate(images, prompt, request_id, timeout_s)
                text, model_name, model_version = reply.text, reply.model_name, reply.model_version
                digest = reply.config_digest
                logprobs = json.dumps(reply.logprobs) if reply.logprobs else ""
                outcome, error = Outcome.OK, ""
                break
            except AdapterError as exc:
                outcome = Outcome.TIMEOUT if exc.timeout else Outcome.TRANSPORT_ERROR
                error = exc.message
                retryable = exc.retryable
                if not exc.retryable or attempt - len(earlier) >= self.settings.max_attempts:
                    break
                failed.append((attempt, a_start, time.perf_counter() - a_t0, outcome.value, error))
                delay = self.settings.retry_backoff_s * 2 ** (attempt - 1)
                await asyncio.sleep(delay * (0.5 + random.random()))
        if outcome is not Outcome.OK:
            log.info(
                "run %s item %s: %s after %d attempts", run.run_id, item_id, outcome.value, attempt
            )
        latency = time.perf_counter() - t0
        self.metrics.requests.labels(ep.name, outcome.value).inc()
        self.metrics.latency.labels(ep.name).observe(latency)
        entry = ResponseEntry(
            run_id=run.run_id,
            benchmark_id=run.benchmark_id,
            benchmark_hash=run.benchmark_hash,
            item_id=item_id,
            format=fmt,
            phrasing=phrasing,
            option_order=option_order,
            image_mode="image" if images else "text_only",
            endpoint_name=ep.name,
            protocol=ep.protocol,
            model_name=model_name,
            model_version=model_version,
            request_id=request_id,
            start_time=start,
            latency_s=latency,
            attempt_count=attempt,
            outcome=outcome,
            raw_text=text,
            error_message=error,
            vigil_version=VIGIL_VERSION,
            model_config_digest=digest,
            logprobs_json=logprobs,
            failed_attempts=tuple(failed),
        )
        last = (attempt, a_start, time.perf_counter() - a_t0, outcome.value, error)
        return entry, retryable and outcome is not Outcome.OK, last

    async def _finish(self, run: Run, state: RunState, message: str) -> None:
        run.state = state
        run.error_message = message
        run.end_time = datetime.now(UTC)
        await self.recorder.flush()
        stored = self.store.get_run(run.run_id)
        if stored is not None:
            run.completed_count, run.error_count = stored.completed_count, stored.error_count
        await self.recorder.commit(RunEndEntry(run=run), run)
        self.metrics.runs_finished.labels(run.endpoint_name, state.value).inc()
        log.info("run %s %s (%d/%d)", run.run_id, state.value, run.completed_count, run.item_count)

    # Schedule --------------------------------------------------------------------------------

    def start_scheduler(self) -> None:
        self._scheduler = asyncio.create_task(self._schedule_loop(), name="scheduler")

    async def _schedule_loop(self) -> None:
        while True:
            try:
                await self.schedule_due()
            except Exception:  # noqa: BLE001 - the scheduler must keep ticking
                log.exception("scheduler tick failed")
            await asyncio.sleep(self.settings.scheduler_tick_s)

    async def schedule_due(self) -> None:
        """Start a run for every endpoint whose interval has passed since its latest run."""
        now = datetime.now(UTC)
        active = set(self._task_endpoint.values())
        for ep in self.store.list_endpoints():
            if ep.schedule_interval_s <= 0 or ep.name in active:
                continue
            latest = self.store.latest_run(ep.name)
            last = max(
                latest.create_time.timestamp() if latest else 0.0,
                self._schedule_failures.get(ep.name, 0.0),
            )
            if now.timestamp() - last < ep.schedule_interval_s:
                continue
            try:
                await self.start_run(ep.name, ep.schedule_benchmark, trigger="schedule")
            except Exception as exc:  # noqa: BLE001 - logged, retried at the next interval
                self._schedule_failures[ep.name] = now.timestamp()
                log.warning("scheduled run for %s not started: %s", ep.name, exc)
