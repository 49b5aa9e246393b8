"""Benchmark: start-up times, as ratios to loading the same tokenizer.json with HF `tokenizers`.

Each measurement is a fresh Python process (what a user waits for), timed wall-clock from spawn:

- peer:      `tokenizers.Tokenizer.from_file(<the qwen3 tokenizer.json>)`, then encode "x";
- load:      `strata_lab.load_tokenizer("qwen3")` plus the chat template, then encode "x";
- tokenize:  `strata-lab tokenize x` (the CLI, to its exit);
- serve:     `strata-lab serve` on the embedded model, until GET /health answers 200.

The machine may be shared and noisy: the four are interleaved round by round (all see the same load) and
each keeps its fastest round. A first round warms the on-disk caches (tokenizer.json, byte table) and is
not counted. Prints the seconds and the ratios to the peer.

    PYTHONPATH=. python benchmarks/startup.py [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _timed(args: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(args, check=True, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(timeout: float = 120.0) -> float:
    import httpx

    port = _port()
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "strata_lab", "serve", "--port", str(port)], env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while time.perf_counter() - t0 < timeout:
            if proc.poll() is not None:
                raise RuntimeError(f"strata-lab serve exited with {proc.returncode}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.5).status_code == 200:
                    return time.perf_counter() - t0
            except httpx.HTTPError:
                pass
            time.sleep(0.02)
        raise RuntimeError("strata-lab serve did not answer /health")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    sys.path.insert(0, str(ROOT))
    from strata_lab.text.tokenizer import TOKENIZER_SPECS, _cached_tokenizer_json

    path = str(_cached_tokenizer_json(TOKENIZER_SPECS["qwen3"]))  # built once, then the same file for both
    py = sys.executable
    runs = {
        "peer": [py, "-c", "import sys; from tokenizers import Tokenizer; "
                 "Tokenizer.from_file(sys.argv[1]).encode('x')", path],
        "load": [py, "-c", "from strata_lab import load_tokenizer; from strata_lab.text.template import "
                 "ChatTemplate; ChatTemplate.from_name('qwen3'); load_tokenizer('qwen3').encode('x')"],
        "tokenize": [py, "-m", "strata_lab", "tokenize", "x"],
    }
    best = {k: float("inf") for k in [*runs, "serve"]}
    for r in tqdm(range(args.rounds + 1), desc="rounds"):
        for name, cmd in runs.items():
            t = _timed(cmd)
            if r:
                best[name] = min(best[name], t)
        t = _serve()
        if r:
            best["serve"] = min(best["serve"], t)
    peer = best["peer"]
    print(f"tokenizer.json: {path}")
    print(f"{'what':<34}{'seconds':>9}{'x peer':>9}")
    labels = {"peer": "HF tokenizers: load + encode", "load": "strata: load_tokenizer + template",
              "tokenize": "strata-lab tokenize x (CLI)", "serve": "strata-lab serve -> /health 200"}
    for name in ("peer", "load", "tokenize", "serve"):
        print(f"{labels[name]:<34}{best[name]:9.2f}{best[name] / peer:9.2f}")


if __name__ == "__main__":
    main()
