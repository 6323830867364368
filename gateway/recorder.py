"""The single writer of the response log: batches entries and commits them in order."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from gateway.domain import LogEntry, Run
from gateway.store import GatewayStore

log = logging.getLogger(__name__)

MAX_BATCH = 1024
LINGER_S = 0.01


@dataclass
class _Pending:
    entry: LogEntry | None
    run_update: Run | None
    done: asyncio.Future[None] | None


class Recorder:
    """Commits log entries in batches; followers wait on ``changed``."""

    def __init__(self, store: GatewayStore) -> None:
        self.store = store
        self.queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self.changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self.error: Exception | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="recorder")

    async def stop(self) -> None:
        """Commit what is queued, then stop."""
        await self.flush()
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def record(self, entry: LogEntry) -> None:
        """Queue an entry; it is committed with the next batch."""
        self.queue.put_nowait(_Pending(entry, None, None))

    async def commit(self, entry: LogEntry | None, run_update: Run | None = None) -> None:
        """Queue an entry and/or a run update and wait until it is committed."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.queue.put_nowait(_Pending(entry, run_update, fut))
        await fut

    async def flush(self) -> None:
        """Wait until everything queued so far is committed."""
        await self.commit(None)
        if self.error is not None:
            raise self.error

    async def notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    async def _loop(self) -> None:
        while True:
            batch = [await self.queue.get()]
            # Group commit: linger briefly so that one transaction carries many responses.
            deadline = time.monotonic() + LINGER_S
            while len(batch) < MAX_BATCH:
                if self.queue.empty():
                    if time.monotonic() >= deadline or batch[-1].done is not None:
                        break
                    await asyncio.sleep(LINGER_S / 5)
                    continue
                batch.append(self.queue.get_nowait())
            entries = [p.entry for p in batch if p.entry is not None]
            updates = [p.run_update for p in batch if p.run_update is not None]
            try:
                if entries or updates:
                    await asyncio.to_thread(self.store.append, entries, updates)
            except Exception as exc:  # noqa: BLE001 - surfaced to every waiter
                log.exception("cannot commit %d log entries", len(entries))
                self.error = exc
                for p in batch:
                    if p.done and not p.done.done():
                        p.done.set_exception(exc)
                continue
            for p in batch:
                if p.done and not p.done.done():
                    p.done.set_result(None)
            await self.notify()
