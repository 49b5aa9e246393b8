"""Prefill CPU-seconds: strata against llama-server peers on the same weights, interleaved round by round.

On a shared machine the wall clock of a prefill measures the others' load as much as the code; the CPU time a
prefill costs its own process moves far less (a thread that waits for a core is not charged). Each round runs
strata's prefill of the prompt (this process: getrusage) and then one /completion of the same token ids on each
llama-server (its threads' utime + stime from /proc, before and after), one thread count for all; the table
gives the best CPU-seconds and the best wall time of each system and strata's ratio against each peer. Both
sides include one greedy token (strata: its lm_head row; llama-server: its sampling), no prompt cache.
strata's kernels follow STRATA_KERNEL (e.g. avx2, against `scripts/build_llama_server.sh --isa avx2`).

    PYTHONPATH=$PWD STRATA_KERNEL=avx2 python benchmarks/kernels/prefill_cpu.py --tokens 256 --threads 1 \\
        --rounds 6 --llama-server avx2=PATH [--llama-server native=PATH] [--layers 4]
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
from pathlib import Path


def _proc_cpu(pid: int) -> float:
    """CPU-seconds (user + system) of every thread of process ``pid`` so far."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / tick


def _own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=256, help="prompt length (random token ids)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--layers", type=int, default=4, help="layers of the Qwen3-0.6B shape (benchmarks/engine.py)")
    ap.add_argument("--llama-server", action="append", default=[], metavar="LABEL=PATH", required=True,
                    help="a llama-server binary to compare against (repeatable)")
    args = ap.parse_args(argv)
    if args.tokens < 1 or args.threads < 1 or args.rounds < 1:
        raise SystemExit("--tokens, --threads and --rounds must be >= 1")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
    from engine import llama_server_extra, model_folder, strata_engine  # benchmarks/engine.py

    servers = llama_server_extra(args.llama_server)
    import httpx
    import numpy as np
    from concurrency import _free_port, _Server
    from strata_lab.engine import _ext
    from strata_lab.tiny.gguf_export import gguf_file

    n, T = args.tokens, args.threads
    path = model_folder("qwen3-0.6b", args.layers)
    prompt = np.random.default_rng(0).integers(0, 151669, n).tolist()
    eng = strata_engine(path, T, None, n + 64)
    sess = eng.session("prefill_cpu")
    sess.reset()
    sess.generate(prompt[:16], max_new_tokens=1).result  # page the weights in
    gguf = gguf_file(path, "f16")
    env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "passive"),
           "GOMP_SPINCOUNT": os.environ.get("GOMP_SPINCOUNT", "20000")}
    running = []
    try:
        for label, binary in servers:
            port = _free_port()
            argv_srv = [binary, "-m", str(gguf), "-np", "1", "-c", str(n + 32), "-t", str(T), "-tb", str(T),
                        "-fa", "off", "--host", "127.0.0.1", "--port", str(port), "--no-warmup"]
            running.append((label, _Server({"args": argv_srv, "env": env}, port).wait()))
        print(f"strata kernels {_ext().kernel_level()}, {n} tokens, {T} threads, {args.layers} layers; "
              f"load average at start {os.getloadavg()[0]:.2f}", flush=True)
        res: dict[str, list[tuple[float, float]]] = {"strata bf16": [], **{f"llama.cpp f16 {lb}": [] for lb, _ in servers}}
        for rnd in range(args.rounds):
            sess.reset()
            c0 = _own_cpu()
            r = sess.generate(prompt, max_new_tokens=1).result
            res["strata bf16"].append((_own_cpu() - c0, r.prefill_ms / 1e3))
            for label, srv in running:
                c0 = _proc_cpu(srv.proc.pid)
                body = {"prompt": list(prompt), "n_predict": 1, "temperature": 0, "ignore_eos": True,
                        "cache_prompt": False}
                resp = httpx.post(srv.url + "/completion", json=body, timeout=3600)
                resp.raise_for_status()
                t = resp.json()["timings"]
                if t["prompt_n"] != n:
                    raise RuntimeError(f"llama-server {label} read {t['prompt_n']} tokens, not {n}")
                res[f"llama.cpp f16 {label}"].append((_proc_cpu(srv.proc.pid) - c0, t["prompt_ms"] / 1e3))
            print(f"  round {rnd + 1}: " + ", ".join(f"{k} {v[-1][0]:.3f} cpu-s / {v[-1][1]:.3f} s"
                                                    for k, v in res.items()), flush=True)
    finally:
        for _, srv in running:
            srv.stop()
    best = {k: (min(c for c, _ in v), min(w for _, w in v)) for k, v in res.items()}
    s_cpu, s_wall = best["strata bf16"]
    print(f"\nbest of {args.rounds} rounds; load average at end {os.getloadavg()[0]:.2f}\n")
    print("| system | CPU-s per prefill | wall s | strata's CPU ratio (peer / strata) | wall ratio |")
    print("|---|---:|---:|---:|---:|")
    for k, (c, w) in best.items():
        print(f"| {k} | {c:.3f} | {w:.3f} | {c / s_cpu:.2f} | {w / s_wall:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
