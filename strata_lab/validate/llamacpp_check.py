"""Check strata's llama.cpp model against a live `llama-server` on a tiny GGUF (`strata_lab.tiny.gguf_export`).

`STRATA_LLAMA_SERVER` names the binary (else `llama-server` on PATH, else the one
`build-llama-server.sh` leaves under ~/.cache/strata-llama-server). Each call is a `/completion` request with
the exact prompt ids, `cache_prompt: true`, greedy sampling, `n_predict` ids and `return_tokens`; the engine's
reuse is `timings.cache_n`. An HTTP 400 (prompt over the slot's context) is a refused call.
"""
from __future__ import annotations

import glob
import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

from strata_lab.validate.workloads import drive

__all__ = ["llama_server", "tiny_gguf", "run_live", "LiveLlama"]


def llama_server() -> str | None:
    env = os.environ.get("STRATA_LLAMA_SERVER")
    if env:
        return env if os.path.exists(env) else None
    found = shutil.which("llama-server")
    if found:
        return found
    hits = sorted(glob.glob(str(Path.home() / ".cache" / "strata-llama-server" / "*" / "vendor" / "llama.cpp" /
                                "build" / "bin" / "llama-server")))
    return hits[-1] if hits else None


def tiny_gguf(kind: str = "qwen3", root=None) -> Path:
    """A tiny GGUF (qwen3: dense; qwen3-next: hybrid), written once under `STRATA_CACHE_DIR`."""
    from strata_lab.tiny import make_tiny
    from strata_lab.tiny.gguf_export import write_gguf

    base = Path(root or os.environ.get("STRATA_CACHE_DIR") or Path.home() / ".cache" / "strata-lab")
    arch = {"qwen3": "qwen3", "qwen3-next": "qwen3_next"}.get(kind)
    if arch is None:
        raise ValueError(f"kind must be qwen3 or qwen3-next, got {kind!r}")
    folder = base / f"validate-{kind}"
    out = base / f"validate-{kind}.gguf"
    if not out.exists():
        folder.mkdir(parents=True, exist_ok=True)
        if arch == "qwen3":
            make_tiny(folder, arch, overrides={"head_dim": 32})
        else:   # llama.cpp's qwen3next has no dense layers: every layer MoE
            make_tiny(folder, arch, "tiny-moe", overrides={"hidden_size": 32, "moe_intermediate_size": 16,
                                                           "shared_expert_intermediate_size": 24,
                                                           "mlp_only_layers": ()})
        write_gguf(folder, out)
    return out


class LiveLlama:
    def __init__(self, gguf, args: str, *, binary: str | None = None, log=None, start_timeout: float = 300):
        self.binary = binary or llama_server()
        if self.binary is None:
            raise RuntimeError("llama-server not found: set STRATA_LLAMA_SERVER to the binary")
        self.gguf, self.args, self.log, self.start_timeout = str(gguf), args, log, start_timeout
        self.proc = None

    def __enter__(self):
        import socket

        import httpx

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        cmd = [self.binary, "-m", self.gguf, "--host", "127.0.0.1", "--port", str(self.port), "-t", "2",
               *shlex.split(self.args)]
        self.logf = open(self.log or os.devnull, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.logf, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + self.start_timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited (rc {self.proc.returncode}); command: {shlex.join(cmd)}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.__exit__(None, None, None)
        raise RuntimeError("llama-server did not come up")

    def __exit__(self, *exc):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if getattr(self, "logf", None):
            self.logf.close()

    def version(self) -> str:
        r = subprocess.run([self.binary, "--version"], capture_output=True, text=True, timeout=30)
        text = (r.stdout + r.stderr).strip().splitlines()
        return next((ln for ln in text if "version" in ln), "unknown")

    def engine(self):
        import httpx

        client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=600)

        def call(req):
            body = {"prompt": req.prompt, "n_predict": req.max_tokens, "cache_prompt": True, "temperature": 0.0,
                    "top_k": 1, "ignore_eos": True, "return_tokens": True}
            r = client.post("/completion", json=body)
            if r.status_code == 400:
                return [], None
            r.raise_for_status()
            d = r.json()
            if isinstance(d.get("id_slot"), int):
                req.slot = d["id_slot"]
            return list(d.get("tokens") or []), int(d["timings"]["cache_n"])
        return call


def run_live(workload, gguf, args: str, *, clients: int = 1, log=None):
    """Serve `workload` on a live llama-server; with `clients` > 1, `workload` is a spec split over clients."""
    with LiveLlama(gguf, args, log=log) as srv:
        if clients == 1:
            return drive(workload, srv.engine()), srv.version()
        from strata_lab.validate.vllm_check import concurrent

        return concurrent(workload, srv.engine, clients), srv.version()
