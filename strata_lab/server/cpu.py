"""CPU-heavy request work off the event loop: bounded worker processes with a time budget, and cheap checks first.

Tokenizing, rendering, schema checks and grammar compiles of a large request run in worker processes
(`--cpu-workers` at once), never on the event loop nor in the server's own threads, so `/health`,
`/props` and small requests keep answering while a 4 MB body is counted or a schema compiles. Small work
(a body under `LIGHT_BYTES`, a grammar compiled before) takes the ordinary thread pool and never waits
behind large work.

Every large job has a budget: at most `workers + queue` of them at once (more: 503 `server_busy`), and
`timeout` seconds from its arrival (more: 503 `cpu_timeout`). The tokenizer and the grammar compiler are
native code that no thread can interrupt, so a large job runs in a process forked for it (the fork shares
the loaded tokenizer, template and grammar compiler, copy-on-write: nothing to load, a few ms to start): a
job over its budget, or whose client left, is killed (SIGKILL) and its worker slot is free at once; the
answer comes back pickled through a pipe. A job still queued when its client leaves or its time runs out
never starts. A worker dies with the server (PR_SET_PDEATHSIG).

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
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from strata_lab.server.errors import RequestError

__all__ = ["CpuPool", "ClientGone", "LIGHT_BYTES", "MAX_TOKEN_BYTES", "min_prompt_tokens"]

LIGHT_BYTES = 64 * 1024   # bodies up to this size do their CPU work in the ordinary thread pool
# The longest token of the Qwen3 vocabulary in bytes (tests/test_server_limits.py checks it against the real
# vocabulary): any text needs at least len(utf-8 bytes) / MAX_TOKEN_BYTES tokens.
MAX_TOKEN_BYTES = 128


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


def _close_sockets(keep: int) -> None:
    """In a forked worker: close the server's sockets (the listener, clients' connections). A connection the
    server closes must not stay open because a worker holds a copy of it; the job needs none of them."""
    import stat

    try:
        fds = [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:  # not Linux: keep them (the worker lives at most its budget)
        return
    for fd in fds:
        if fd <= 2 or fd == keep:
            continue
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                os.close(fd)
        except OSError:
            pass


def _worker_main(conn, fn, args, bulk: bool, hooks) -> None:
    """A forked worker: run fn(*args), send ("ok", result) or ("error", exception) back, exit."""
    import signal

    try:  # die with the server, whatever kills it
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    for sig in (signal.SIGINT, signal.SIGTERM):  # the server's handlers are not the worker's
        signal.signal(sig, signal.SIG_DFL)
    try:
        signal.set_wakeup_fd(-1)  # the event loop's wake-up socket belongs to the server
    except (ValueError, OSError):
        pass
    _close_sockets(conn.fileno())
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the tokenizer's thread pool did not survive the fork
    if bulk:
        try:
            os.nice(10)  # bulk text work: below the engine and the other workers
        except OSError:
            pass
    for hook in hooks:  # locks another server thread may have held at the fork
        hook()
    try:
        out = ("ok", fn(*args))
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the server to be answered
        out = ("error", exc)
    try:
        conn.send(out)
    except Exception as exc:  # an answer that does not pickle
        conn.send(("error", RuntimeError(f"{type(exc).__name__}: {exc}")))
    conn.close()


class _Job:
    """One large job's worker process, as the server sees it (kill() from the event loop)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc = None
        self.killed = False

    def kill(self) -> None:
        with self.lock:
            self.killed = True
            if self.proc is not None and self.proc.is_alive():
                self.proc.kill()


class CpuPool:
    """At most `workers` worker processes for large CPU work; `queue` more jobs may wait; each gets `timeout`
    seconds from its arrival. `after_fork`: callables a worker runs first (each re-creates the locks of one
    object the job uses, which another server thread may have held when the worker was forked)."""

    def __init__(self, workers: int = 2, queue: int = 8, timeout: float = 120.0):
        if not 1 <= workers <= 64:
            raise ValueError(f"workers must be in 1..64, got {workers}")
        if not 0 <= queue <= 1024:
            raise ValueError(f"queue must be in 0..1024, got {queue}")
        if not 0 < timeout <= 3600:
            raise ValueError(f"timeout must be in (0, 3600] seconds, got {timeout}")
        self.workers, self.queue, self.timeout = workers, queue, timeout
        # one thread a running worker: it forks the worker and waits for its answer
        # (twice as many: a killed worker's thread still reaps it while a new job starts)
        self._executor = ThreadPoolExecutor(max_workers=2 * workers, thread_name_prefix="strata-cpu")
        self.after_fork: list[Callable[[], None]] = []
        self.pending = 0      # large jobs submitted and not yet ended (running or queued)
        self.running = 0      # worker processes at work
        self.refused = 0      # 503s: pool full or budget spent
        self.stopped = 0      # workers killed: over budget, or their client left
        self.pids: set[int] = set()   # the running workers' process ids
        self._waiters: list[asyncio.Future] = []

    async def run(self, fn: Callable[..., Any], *args: Any, heavy: bool, what: str = "the request",
                  request=None, bulk: bool = False) -> Any:
        """`fn(*args)` off the event loop; `heavy` work in a worker process, within the pool's bound and budget.
        `request`: a Starlette request whose disconnect drops the job (ClientGone), queued or running.
        `bulk`: large text work, run at a lower CPU priority than the event loop and the engine."""
        if not heavy:
            from starlette.concurrency import run_in_threadpool

            return await run_in_threadpool(fn, *args)
        if self.pending >= self.workers + self.queue:
            self.refused += 1
            raise RequestError(None, f"the server is busy with {self.pending} large requests (--cpu-workers "
                               f"{self.workers}, queue {self.queue}); retry later", code="server_busy", status=503)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        self.pending += 1
        try:
            while self.running >= self.workers:  # queued: wait for a worker slot
                await self._check(loop, deadline, request, what)
                waiter = loop.create_future()
                self._waiters.append(waiter)
                try:
                    await asyncio.wait({waiter}, timeout=min(max(deadline - loop.time(), 0), 0.2))
                finally:
                    if waiter in self._waiters:
                        self._waiters.remove(waiter)
            await self._check(loop, deadline, request, what)
            self.running += 1
            job = _Job()
            try:
                answer = loop.run_in_executor(self._executor, self._work, job, fn, args, bulk)
                while True:
                    done, _ = await asyncio.wait({answer}, timeout=min(max(deadline - loop.time(), 0), 0.2))
                    if done:
                        kind, value = answer.result()
                        break
                    try:
                        await self._check(loop, deadline, request, what, stopping=True)
                    except BaseException:
                        job.kill()
                        self.stopped += 1
                        raise
            except asyncio.CancelledError:
                job.kill()
                raise
            finally:
                self.running -= 1
                for w in self._waiters:
                    if not w.done():
                        w.set_result(None)
        finally:
            self.pending -= 1
        if kind == "ok":
            return value
        if kind == "error":
            raise value
        raise RequestError(None, f"{what} failed: its worker process ended without an answer ({value})",
                           code="cpu_worker_failed", status=503)

    async def _check(self, loop, deadline: float, request, what: str, *, stopping: bool = False) -> None:
        if deadline - loop.time() <= 0:
            self.refused += 1
            raise RequestError(None, f"{what} took longer than the CPU budget of {self.timeout:g} s "
                               f"(--cpu-timeout){'; it was stopped' if stopping else ''}", code="cpu_timeout",
                               status=503)
        if request is not None and await request.is_disconnected():
            raise ClientGone()

    def _work(self, job: _Job, fn, args, bulk: bool):
        """In a pool thread: fork the worker, wait for its answer (or its death), reap it."""
        import multiprocessing

        ctx = multiprocessing.get_context("fork")
        recv_end, send_end = ctx.Pipe(duplex=False)
        with job.lock:
            if job.killed:
                recv_end.close()
                send_end.close()
                return "killed", "stopped before it started"
            proc = ctx.Process(target=_worker_main, args=(send_end, fn, args, bulk, list(self.after_fork)),
                               daemon=True, name="strata-cpu-worker")
            try:
                proc.start()
            except OSError as exc:  # no memory or process slot for a fork: a 503, the server goes on
                recv_end.close()
                send_end.close()
                return "killed", f"cannot start a worker process: {exc.strerror or exc}"
            job.proc = proc
            self.pids.add(proc.pid)
        send_end.close()
        try:
            try:
                return recv_end.recv()
            except (EOFError, OSError):
                pass
            proc.join(5)
            return "killed", "stopped" if job.killed else f"exit code {proc.exitcode}"
        finally:
            recv_end.close()
            if proc.is_alive():
                proc.join(5)
                if proc.is_alive():
                    proc.kill()
                    proc.join()
            else:
                proc.join()
            self.pids.discard(proc.pid)

    def close(self) -> None:
        for pid in list(self.pids):
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        self._executor.shutdown(wait=False, cancel_futures=True)
