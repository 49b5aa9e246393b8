"""Decode at a long context with the q8 KV cache, two builds turn by turn (issue 32): the measure of
q8_decode_engine.py (the --preset shape with --layers layers, bf16 random weights, kv_cache="q8", --threads threads,
one --context-token prefill, then decodes of --decode tokens from the held prompt with the per-op timers), but both
builds (a PYTHONPATH each: --a, e.g. a copy of strata_lab/ holding another _engine .so, and --b) stay loaded in
their own process and take turns, one round each, --rounds times (the first of each pair alternating). This
machine's memory bandwidth shifts by up to 1.7x within minutes (the non-attention part of a full-depth decode
step ran at 20 ms in one run and 36 ms in the next), so only rounds taken side by side compare.

Printed per round and build: decode tok/s, attention ms per token, its share of the timed decode ops, and the rest.

    python benchmarks/kernels/q8_decode_engine_ab.py --a /path/old --b $PWD [--layers 28] [--rounds 6]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def child(args):
    os.environ.setdefault("STRATA_PROFILE", "1")
    import numpy as np

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import engine as bench  # noqa: E402  (benchmarks/engine.py: the model folder)
    from strata_lab.engine import Engine, _ext

    ext = _ext()
    path = bench.model_folder(args.preset, None if args.layers == 28 and args.preset == "qwen3-0.6b" else args.layers)
    eng = Engine.load(path, threads=args.threads, kv_cache="q8", max_context=args.context + 8 * args.decode)
    prompt = np.random.default_rng(0).integers(0, 151669, args.context).tolist()
    s = eng.session("q8")
    t0 = time.perf_counter()
    s.generate(prompt, max_new_tokens=args.decode).result
    print(json.dumps({"ready": time.perf_counter() - t0, "level": ext.kernel_level()}), flush=True)
    for line in sys.stdin:
        if line.strip() != "go":
            break
        ext._profile(True)
        r = s.generate(prompt, max_new_tokens=args.decode).result
        prof = ext._profile(True)
        assert r.tokens_read <= 1 and len(r.gen_ids) == args.decode
        d = prof["decode"]
        secs = d["seconds"]
        total = sum(secs.values())
        att = secs.get("attention", 0.0)
        n = max(1, d["tokens"])
        print(json.dumps({"tok_s": args.decode / (r.decode_ms / 1e3), "att_ms": att * 1e3 / n,
                          "share": 100 * att / total, "rest_ms": (total - att) * 1e3 / n}), flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", help="PYTHONPATH of build a")
    ap.add_argument("--b", help="PYTHONPATH of build b")
    ap.add_argument("--preset", default="qwen3-0.6b")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--context", type=int, default=16384)
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    if not (args.a and args.b):
        ap.error("--a and --b are required")
    common = ["--preset", args.preset, "--layers", str(args.layers), "--context", str(args.context), "--decode",
              str(args.decode), "--threads", str(args.threads), "--child"]
    procs = {}
    for name, path in (("a", args.a), ("b", args.b)):  # one prefill at a time
        p = subprocess.Popen([sys.executable, os.path.abspath(__file__), *common], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": path})
        info = json.loads(p.stdout.readline())
        print(f"{name}: level {info['level']}, prefill + first decode {info['ready']:.1f} s", flush=True)
        procs[name] = p
    rows = {"a": [], "b": []}
    try:
        for rnd in range(args.rounds):
            for name in ("a", "b") if rnd % 2 == 0 else ("b", "a"):
                p = procs[name]
                p.stdin.write("go\n")
                p.stdin.flush()
                r = json.loads(p.stdout.readline())
                rows[name].append(r)
                print(f"round {rnd + 1} {name}: decode {r['tok_s']:.2f} tok/s, attention {r['att_ms']:.2f} ms/token = "
                      f"{r['share']:.1f} % of decode, the rest {r['rest_ms']:.2f} ms/token", flush=True)
    finally:
        for p in procs.values():
            p.stdin.close()
            p.wait()
    for name in ("a", "b"):
        att = sorted(r["att_ms"] for r in rows[name])
        share = sorted(r["share"] for r in rows[name])
        print(f"{name}: attention ms/token median {att[len(att) // 2]:.2f} (min {att[0]:.2f}), share median "
              f"{share[len(share) // 2]:.1f} % (min {share[0]:.1f} %)")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
