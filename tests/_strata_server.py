"""Start a real `strata-lab serve` process on a free port for the server test tier."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import httpx

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_model(kind: str = "hybrid") -> Path:
    """The server's own default model folder (generated once into the test cache)."""
    from strata_lab.tiny import embedded_model

    return embedded_model(kind)


def listens_on(pid: int, port: int) -> bool:
    """Whether process `pid` holds the socket listening on `port` (Linux's /proc; True where it cannot tell)."""
    try:
        inodes = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with open(table) as f:
                for row in f.read().splitlines()[1:]:
                    fields = row.split()
                    if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                        inodes.add(f"socket:[{fields[9]}]")
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return True
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
        except OSError:  # closed meanwhile
            continue
    return False


class ServerProcess:
    """`python -m strata_lab serve ...` with its own dump file and stderr log."""

    def __init__(self, tmp: Path, *args: str, env: dict | None = None, name: str = "server"):
        self.dump = tmp / f"{name}.jsonl"
        self.log = tmp / f"{name}.log"
        self._args, self._env, self._log = args, {**os.environ, **(env or {})}, None
        self._start()

    def _start(self) -> None:
        from strata_lab._spawn import child_process_args

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # the child imports the same strata_lab as the tests (installed, or a checkout on PYTHONPATH)
        spawn = child_process_args(["serve", "--port", self.port, "--dump", self.dump, *self._args], env=self._env)
        if self._log is not None:
            self._log.close()
        self._log = open(self.log, "wb")
        self.proc = subprocess.Popen(**spawn, stdout=self._log, stderr=subprocess.STDOUT)

    @classmethod
    def adopt(cls, proc: subprocess.Popen, port: int, log: Path) -> "ServerProcess":
        """A server a test started itself (its own limits or environment), waited for as one of ours; it is
        never restarted on another port."""
        srv = cls.__new__(cls)
        srv.proc, srv.port, srv.url, srv.log = proc, port, f"http://127.0.0.1:{port}", log
        return srv.wait()

    def wait(self, timeout: float = 60) -> "ServerProcess":
        """Until /health answers from this process. The free port may be taken by another process (another
        test worker's server) before the child binds it: the child then exits, and starts again on a new port."""
        deadline = time.time() + timeout
        restarts = 3
        while time.time() < deadline:
            if self.proc.poll() is not None:
                # (a process this class did not start, waited for as one, is not restarted)
                if restarts and hasattr(self, "_args") and "address already in use" in self.log_text().lower():
                    restarts -= 1
                    self._start()
                    continue
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                if (httpx.get(self.url + "/health", timeout=1).status_code == 200
                        and listens_on(self.proc.pid, self.port)):
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server did not come up:\n{self.log.read_text()}")

    def lines(self) -> list[dict]:
        if not self.dump.exists():
            return []
        return [json.loads(line) for line in self.dump.read_text().splitlines() if line.strip()]

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


def health_while(url: str, fn, samples: int = 10) -> tuple[object, float, float, float]:
    """(fn()'s result, the slowest /health answer while fn ran, the slowest of `samples` /health answers just
    before it, fn's own time). The baseline is measured on the same machine under the same load, so a check
    built on it holds on a loaded machine as on an idle one (see `assert_no_stall`)."""
    import threading

    baseline = 0.0
    for _ in range(samples):
        t = time.perf_counter()
        assert httpx.get(url + "/health", timeout=120).status_code == 200
        baseline = max(baseline, time.perf_counter() - t)
    out: dict = {}

    def run():
        t = time.perf_counter()
        try:
            out["r"] = fn()
        finally:
            out["t"] = time.perf_counter() - t

    thread = threading.Thread(target=run)
    thread.start()
    worst = 0.0
    while thread.is_alive():
        t = time.perf_counter()
        assert httpx.get(url + "/health", timeout=120).status_code == 200
        worst = max(worst, time.perf_counter() - t)
        time.sleep(0.02)
    thread.join()
    return out["r"], worst, baseline, out["t"]


def assert_no_stall(worst: float, baseline: float, took: float) -> None:
    """/health did not wait for the request's work: its slowest answer during the request is neither a large
    share of the request's own time nor far above its baseline. A stall (the event loop held by the work)
    makes /health wait about as long as the work (the first /health after the work began waits for nearly all
    of it), so it fails both; no wall-clock limit is assumed. On a machine busy with other processes one
    /health answer can be late by a scheduling slice without any stall: the share is three quarters."""
    assert worst < max(0.75 * took, 10 * baseline), (
        f"/health took {worst:.3f} s during a {took:.3f} s request (baseline {baseline:.3f} s)")
