"""CPU-heavy request work off the event loop: a bounded pool with a time budget, and cheap checks that run first.

Tokenizing, rendering, schema checks and grammar compiles of a large request run in `CpuPool`'s few
threads (`--cpu-workers`), never on the event loop, so `/health`, `/props` and small requests keep answering
while a 4 MB body is counted or a schema compiles. Small work (a body under `LIGHT_BYTES`) takes the
ordinary thread pool and never waits behind large work.

Every large job has a budget: at most `workers + queue` of them at once (more: 503 `server_busy`), and
`timeout` seconds (more: 503 `cpu_timeout`). A job still queued when its client leaves or its time runs out
never starts; one already running cannot be interrupted (tokenizer and grammar code are native), so it
keeps its worker until it ends: the pool's bound holds, the client is answered at once.

>>> import asyncio
>>> async def demo():
...     pool = CpuPool(workers=1, queue=0, timeout=5)
...     return await pool.run(sum, [1, 2, 3], heavy=True, what="sum")
>>> asyncio.run(demo())
6
>>> min_prompt_tokens([{"role": "user", "content": "x" * 1000}])  # at most MAX_TOKEN_BYTES bytes per token
8
"""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from strata_lab.server.errors import RequestError

__all__ = ["CpuPool", "ClientGone", "LIGHT_BYTES", "MAX_TOKEN_BYTES", "min_prompt_tokens"]

LIGHT_BYTES = 64 * 1024   # bodies up to this size do their CPU work in the ordinary thread pool
# The longest token of the Qwen3 vocabulary in bytes (tests/test_server_limits.py checks it against the real
# vocabulary): any text needs at least len(utf-8 bytes) / MAX_TOKEN_BYTES tokens.
MAX_TOKEN_BYTES = 128


def _set_nice(offset: int) -> None:
    """This thread's CPU priority: the process's own nice plus `offset` (Linux: nice is per thread)."""
    import os
    import threading

    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(19, _BASE_NICE + offset))
    except (AttributeError, OSError):  # not Linux, or not allowed: same priority
        pass


def _at_priority(fn, low: bool, args):
    """Bulk work (tokenizing or rendering a large body) runs at nice +10 below the event loop and the engine
    thread, so small requests keep their latency while a 4 MB body is counted; other work at normal priority."""
    _set_nice(10 if low else 0)
    return fn(*args)


try:
    import os as _os

    _BASE_NICE = _os.getpriority(_os.PRIO_PROCESS, 0)
except (AttributeError, OSError):  # pragma: no cover - not POSIX
    _BASE_NICE = 0


class ClientGone(Exception):
    """The client disconnected while its work waited: nothing to answer."""


def min_prompt_tokens(messages: list[dict]) -> int:
    """A lower bound on a chat prompt's tokens, from its user / system / tool texts alone (every template
    renders those): the cheap context check made before any rendering or tokenizing."""
    total = 0
    for msg in messages:
        if msg.get("role") in ("user", "system", "tool") and isinstance(msg.get("content"), str):
            total += len(msg["content"].encode("utf-8", "surrogatepass"))
    return -(-total // MAX_TOKEN_BYTES)  # ceil: n bytes need at least this many tokens


class CpuPool:
    """`workers` threads for large CPU work; `queue` more jobs may wait; each gets `timeout` seconds."""

    def __init__(self, workers: int = 2, queue: int = 8, timeout: float = 120.0):
        if not 1 <= workers <= 64:
            raise ValueError(f"workers must be in 1..64, got {workers}")
        if not 0 <= queue <= 1024:
            raise ValueError(f"queue must be in 0..1024, got {queue}")
        if not 0 < timeout <= 3600:
            raise ValueError(f"timeout must be in (0, 3600] seconds, got {timeout}")
        self.workers, self.queue, self.timeout = workers, queue, timeout
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="strata-cpu")
        self.pending = 0      # large jobs submitted and not yet ended (running or queued)
        self.refused = 0      # 503s: pool full or budget spent

    async def run(self, fn: Callable[..., Any], *args: Any, heavy: bool, what: str = "the request",
                  request=None, bulk: bool = False) -> Any:
        """`fn(*args)` off the event loop; `heavy` work goes through the bounded pool and its budget.
        `request`: a Starlette request whose disconnect drops the job (ClientGone) before it starts.
        `bulk`: large text work, run at a lower CPU priority than the event loop and the engine."""
        if not heavy:
            from starlette.concurrency import run_in_threadpool

            return await run_in_threadpool(fn, *args)
        if self.pending >= self.workers + self.queue:
            self.refused += 1
            raise RequestError(None, f"the server is busy with {self.pending} large requests (--cpu-workers "
                               f"{self.workers}, queue {self.queue}); retry later", code="server_busy", status=503)
        loop = asyncio.get_running_loop()
        self.pending += 1
        fut = self._executor.submit(_at_priority, fn, bulk, args)
        fut.add_done_callback(lambda _f: loop.call_soon_threadsafe(self._ended))
        waiter = asyncio.wrap_future(fut, loop=loop)
        deadline = loop.time() + self.timeout
        while True:
            left = deadline - loop.time()
            if left <= 0:
                fut.cancel()  # a queued job never starts; a running one ends on its own
                self.refused += 1
                raise RequestError(None, f"{what} took longer than the CPU budget of {self.timeout:g} s "
                                   "(--cpu-timeout)", code="cpu_timeout", status=503)
            done, _ = await asyncio.wait({waiter}, timeout=min(left, 0.2))
            if done:
                return waiter.result()
            if request is not None and await request.is_disconnected():
                fut.cancel()
                raise ClientGone()

    def _ended(self) -> None:
        self.pending -= 1

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
