"""Concurrent greedy streams (issue 32): `strata-lab serve --slots N` against `llama-server -np N` on the same
weights (a GGUF of the same random model folder, strata_lab.tiny.gguf_export), N = 1, 2, 4, 8 streams, in one
run: one server of each kind with max(N) slots (`--slots`, `-np`) for the whole run, --rounds sweeps over N
alternating the order of N and of the two servers, medians per (server, N), so that a shared machine's
changing load hits every cell alike.

Each stream is one raw-token `/completion` request (the same endpoint and body on both servers: a prompt of
--prompt random ids, `n_predict` --decode, temperature 0, ignore_eos, streamed), all N sent at once. Per
stream: time to first token (TTFT, from sending to the first streamed token) and decode tok/s ((decode - 1)
tokens over the time from the first to the last token). Per run: aggregate decode tok/s = the tokens all
streams received while every stream was decoding (from the last stream's first token to the first
stream's last one: the steady state, no prompt being read) over that window (the issue's target), its ratio
to the same server's at 1 stream ("scaling") and to llama-server's at the same N; decode-phase tok/s = N x
(decode - 1) tokens from the earliest first token to the last token (prompts still being read by some
streams included); end-to-end tok/s = N x decode tokens over the wall time from the first request sent to
the last token (every prefill included).

strata runs its server in a fresh interpreter (one worker lane per slot; the engine batches the decode
steps of the slots that decode together: Engine.step_stats, shown as the mean batch). llama-server is found
in $STRATA_LLAMA_SERVER or on PATH (build it from the llama.cpp vendored in the llama-cpp-python sdist);
without it the peer rows are skipped with a note.

    PYTHONPATH=$PWD python benchmarks/concurrency.py [--preset qwen3-0.6b] [--layers L] [--streams 1 2 4 8]
        [--prompt 64] [--decode 32] [--threads 2] [--rounds 3] [--out benchmarks/results/concurrency.md]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Server:
    def __init__(self, popen: dict, port: int):
        self.url = f"http://127.0.0.1:{port}"
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(**popen, stdout=self.log, stderr=subprocess.STDOUT)

    def wait(self, timeout: float = 300.0) -> "_Server":
        import httpx

        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"server exited: {self.log.read().decode(errors='replace')[-3000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError("server did not come up")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=20)
        self.log.close()


def strata_server(path: Path, slots: int, threads: int, ctx: int) -> _Server:
    port = _free_port()
    from strata_lab._spawn import child_process_args

    spawn = child_process_args(["serve", "--model", str(path), "--slots", str(slots), "--threads", str(threads),
                                "--ctx", str(ctx), "--port", str(port)], env=dict(os.environ))
    return _Server(spawn, port)


def llama_server(binary: str, gguf: Path, slots: int, threads: int, ctx: int) -> _Server:
    port = _free_port()
    argv = [binary, "-m", str(gguf), "-np", str(slots), "-c", str(ctx * slots), "-t", str(threads), "-tb",
            str(threads), "--host", "127.0.0.1", "--port", str(port), "--no-warmup"]
    # OpenMP waits as strata's server's do (strata_lab.engine's defaults unless the user set them): on shared
    # cores llama.cpp's default spinning waiters decoded several times slower (benchmarks/peers.py)
    env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "passive"),
           "GOMP_SPINCOUNT": os.environ.get("GOMP_SPINCOUNT", "20000")}
    return _Server({"args": argv, "env": env}, port)


def _stream(url: str, prompt: list[int], n_decode: int, out: dict) -> None:
    import httpx

    body = {"prompt": prompt, "n_predict": n_decode, "temperature": 0, "ignore_eos": True, "stream": True,
            "cache_prompt": False}
    t0 = time.perf_counter()
    first = None
    n = 0
    stamps = []
    with httpx.stream("POST", url + "/completion", json=body, timeout=3600) as r:
        if r.status_code != 200:
            r.read()
            raise RuntimeError(f"{url}: {r.status_code} {r.text[:300]}")
        for line in r.iter_lines():
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                break
            ev = json.loads(payload)
            if ev.get("stop"):  # the final body (it may repeat every token): not a new one
                break
            if ev.get("content") or ev.get("tokens"):
                k = max(1, len(ev.get("tokens") or []))
                n += k
                stamps.extend([time.perf_counter()] * k)
                if first is None:
                    first = stamps[-1]
    t1 = time.perf_counter()
    out.update(t0=t0, first=first if first is not None else t1, end=stamps[-1] if stamps else t1, tokens=n,
               stamps=stamps)


def run_streams(url: str, prompts: list[list[int]], n_decode: int) -> dict:
    outs = [dict() for _ in prompts]
    threads = [threading.Thread(target=_stream, args=(url, p, n_decode, o)) for p, o in zip(prompts, outs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if any("end" not in o for o in outs):
        raise RuntimeError("a stream failed")
    t0 = min(o["t0"] for o in outs)
    t1 = max(o["end"] for o in outs)
    per = [(n_decode - 1) / max(o["end"] - o["first"], 1e-9) for o in outs]
    first = min(o["first"] for o in outs)
    lo, hi = max(o["first"] for o in outs), min(o["end"] for o in outs)
    inside = sum(1 for o in outs for t in o["stamps"] if lo < t <= hi)
    return {"aggregate": inside / (hi - lo) if hi > lo and inside else float("nan"),
            "decode_phase": len(prompts) * (n_decode - 1) / max(t1 - first, 1e-9),
            "end_to_end": len(prompts) * n_decode / (t1 - t0), "per_stream": statistics.median(per),
            "ttft": statistics.median(o["first"] - o["t0"] for o in outs),
            "tokens": [o["tokens"] for o in outs]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="qwen3-0.6b")
    ap.add_argument("--layers", type=int, default=None, help="the preset's layer shape, fewer layers")
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip", default="", help="comma list: strata,llama")
    ap.add_argument("--rounds", type=int, default=3, help="sweeps of every N, alternating the order (medians)")
    ap.add_argument("--out", default=None, help="write the markdown table here")
    args = ap.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    if any(n < 1 or n > 64 for n in args.streams) or args.prompt < 1 or args.decode < 2:
        ap.error("--streams in 1..64, --prompt >= 1, --decode >= 2")
    from engine import model_folder  # benchmarks/engine.py

    path = model_folder(args.preset, args.layers)
    ctx = args.prompt + args.decode + 16
    binary = os.environ.get("STRATA_LLAMA_SERVER") or shutil.which("llama-server")
    gguf = None
    if "llama" not in skip:
        if binary is None:
            print("llama-server not found ($STRATA_LLAMA_SERVER or PATH): its rows are skipped", flush=True)
            skip.add("llama")
        else:
            from strata_lab.tiny.gguf_export import gguf_file

            gguf = gguf_file(path, "f16")
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 151000, args.prompt).tolist() for _ in range(max(args.streams))]
    rows: dict = {}
    shape = f"{args.preset}" + (f", {args.layers} layers" if args.layers else "")
    print(f"{shape} bf16 weights (llama.cpp: f16 GGUF), prompt {args.prompt} ids, {args.decode} tokens per "
          f"stream, {args.threads} threads", flush=True)
    N = max(args.streams)
    servers = {}
    try:
        for system in ("strata", "llama"):
            if system in skip:
                continue
            servers[system] = (strata_server(path, N, args.threads, ctx) if system == "strata"
                               else llama_server(binary, gguf, N, args.threads, ctx)).wait()
            run_streams(servers[system].url, prompts[:1], 4)  # warm: weights paged in, threads started
        runs: dict = {}
        for rnd in range(args.rounds):
            order = list(args.streams) if rnd % 2 == 0 else list(reversed(args.streams))
            for n in order:
                for system in (("strata", "llama") if rnd % 2 == 0 else ("llama", "strata")):
                    if system not in servers:
                        continue
                    url = servers[system].url
                    if system == "strata":
                        import httpx

                        b0 = httpx.get(url + "/props", timeout=30).json()["batch"]
                    r = run_streams(url, prompts[:n], args.decode)
                    if system == "strata":
                        b1 = httpx.get(url + "/props", timeout=30).json()["batch"]
                        r["mean_batch"] = (b1["tokens"] - b0["tokens"]) / max(b1["steps"] - b0["steps"], 1)
                        r["max_batch"] = b1["max_batch"]
                    runs.setdefault((system, n), []).append(r)
                    print(f"  round {rnd} {system:6s} N={n}: aggregate {r['aggregate']:.2f} tok/s, per stream "
                          f"{r['per_stream']:.2f}, TTFT {r['ttft'] * 1e3:.0f} ms, decode phase "
                          f"{r['decode_phase']:.2f}, end-to-end {r['end_to_end']:.2f} tok/s"
                          + (f", mean batch {r['mean_batch']:.2f}" if "mean_batch" in r else ""), flush=True)
    finally:
        for srv in servers.values():
            srv.stop()
    rows = {}
    for (system, n) in sorted(runs, key=lambda k: (k[1], k[0] != "strata")):
        rs = runs[(system, n)]
        rows[(system, n)] = {k: statistics.median(r[k] for r in rs) for k in rs[0] if k not in ("tokens", "max_batch")}
        if "max_batch" in rs[0]:
            rows[(system, n)]["max_batch"] = max(r["max_batch"] for r in rs)
    lines = [f"# Concurrent greedy streams ({shape}; {args.prompt}-id prompts, {args.decode} tokens each, "
             f"{args.threads} threads, one run, medians of {args.rounds} rounds; servers with {N} slots)", "",
             "| system | streams | aggregate decode tok/s | x its 1 stream | strata / llama-server | "
             "per-stream decode tok/s | TTFT ms | decode-phase tok/s | end-to-end tok/s | mean batch |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for (system, n), r in rows.items():
        one = rows.get((system, 1))
        peer = rows.get(("llama", n))
        scaling = f"{r['aggregate'] / one['aggregate']:.2f}x" if one else ""
        vs = f"{r['aggregate'] / peer['aggregate']:.2f}x" if system == "strata" and peer else ""
        batch = f"{r['mean_batch']:.2f} (max {r['max_batch']})" if "mean_batch" in r else ""
        lines.append(f"| {'strata-lab serve' if system == 'strata' else 'llama-server'} | {n} | "
                     f"{r['aggregate']:.2f} | {scaling} | {vs} | {r['per_stream']:.2f} | {r['ttft'] * 1e3:.0f} | "
                     f"{r['decode_phase']:.2f} | {r['end_to_end']:.2f} | {batch} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
