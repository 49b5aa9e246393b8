"""One engine, requests taken in arrival order, up to one per slot at a time.

`EngineWorker` owns `lanes` threads (the server starts one per slot) that take jobs from one FIFO queue.
Requests on different slots then run at the same time, and the engine advances the sessions that are
decoding together in shared steps (continuous batching: `Engine.step_stats`); a request on a slot that is
busy waits for it (`ChatRunner.run`), so one session still serves one call at a time. A job's events travel back to the
asyncio side through an `asyncio.Queue` fed with `call_soon_threadsafe`, so the HTTP layer awaits them
without blocking the event loop. A job can be cancelled (client gone): if it has not started it never
reaches the engine; if it is running, the job function sees `job.cancelled` and stops its stream.

>>> import asyncio
>>> async def demo():
...     worker = EngineWorker()
...     job = worker.submit(lambda job: (job.emit("text", "hi"), job.emit("done", None)))
...     out = [item async for item in job.events()]
...     worker.close()
...     return out
>>> asyncio.run(demo())
[('text', 'hi'), ('done', None)]
"""
from __future__ import annotations

import asyncio
import queue
import sys
import threading
import traceback
from typing import Any, AsyncIterator, Awaitable, Callable

__all__ = ["EngineWorker", "Job"]

_END = ("_end", None)


class Job:
    """A unit of engine work; emits (kind, payload) events and ends after "done" or "error"."""

    def __init__(self, fn: Callable[["Job"], Any], loop: asyncio.AbstractEventLoop,
                 left: Callable[[], Awaitable[bool]] | None = None):
        self.fn = fn
        self._loop = loop
        self._left = left   # async: whether the job's client left (asked on the loop right before it runs)
        self._queue: asyncio.Queue = asyncio.Queue()
        self._cancel = threading.Event()
        self.started = threading.Event()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def cancel(self) -> None:
        """Ask the job to stop (safe from any thread, any number of times)."""
        self._cancel.set()

    def emit(self, kind: str, payload: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, (kind, payload))
        except RuntimeError:  # the event loop is gone (shutdown): nobody is listening
            pass

    async def events(self) -> AsyncIterator[tuple[str, Any]]:
        """The job's events until it ends."""
        while True:
            item = await self._queue.get()
            if item[0] == "_end":
                return
            yield item

    def _client_left(self) -> bool:
        """Whether the job's client left, asked on the event loop as the job reaches the engine (a watcher polling
        the connection may not have seen a client that left a moment ago); False when nobody can tell within a
        second (the loop gone or busy: the job runs, and a watcher still stops it)."""
        if self._left is None:
            return False
        try:
            return bool(asyncio.run_coroutine_threadsafe(self._left(), self._loop).result(timeout=1.0))
        except Exception:
            return False

    def _run(self) -> bool:
        """Run the job unless it was cancelled while queued (its client left); False: dropped unrun."""
        self.started.set()
        if self.cancelled or self._client_left():
            self.cancel()
            self.emit(*_END)
            return False
        try:
            self.fn(self)
        except BaseException as exc:  # reported to the client, never kills the worker
            from strata_lab.server.errors import RequestError

            if not isinstance(exc, RequestError):
                traceback.print_exc(file=sys.stderr)
            self.emit("error", exc)
        finally:
            self.emit(*_END)
        return True


class EngineWorker:
    """`lanes` threads running submitted jobs in arrival order (FIFO), up to `lanes` at once."""

    def __init__(self, lanes: int = 1) -> None:
        if isinstance(lanes, bool) or not isinstance(lanes, int) or not 1 <= lanes <= 256:
            raise ValueError(f"lanes must be an int in 1..256, got {lanes!r}")
        self._jobs: queue.Queue = queue.Queue()
        self._count = threading.Lock()
        self.lanes = lanes
        self.running = 0
        self.done = 0
        self.dropped = 0  # jobs whose client left while they were queued: never run
        self._threads = [threading.Thread(target=self._loop, name=f"strata-engine-{i}", daemon=True)
                         for i in range(lanes)]
        for t in self._threads:
            t.start()

    def submit(self, fn: Callable[[Job], Any], left: Callable[[], Awaitable[bool]] | None = None) -> Job:
        """Queue `fn(job)`; call from the event loop's thread. `left` (async): whether the job's client left,
        asked right before the job runs (a job whose client left is dropped unrun)."""
        job = Job(fn, asyncio.get_running_loop(), left)
        self._jobs.put(job)
        return job

    @property
    def waiting(self) -> int:
        return self._jobs.qsize()

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            with self._count:
                self.running += 1
            ran = job._run()
            with self._count:
                self.running -= 1
                if ran:
                    self.done += 1
                else:
                    self.dropped += 1

    def close(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)
        for t in self._threads:
            t.join(timeout=5)
