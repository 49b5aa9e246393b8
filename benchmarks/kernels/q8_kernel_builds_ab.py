"""Decode attention over a q8 KV cache, the kernel alone, two builds of the engine against each other (issue 32):
Qwen3-0.6B's attention shape (16 query heads, 8 kv heads, head_dim 128), one query, --context keys, caches made
by _quantize_q8 (and laid out in the cache's pages by _q8_pages, on 64-byte lines, where the build has it: a
build from before the pages reads the rows as given). Each cell runs in its own process (a build is a PYTHONPATH: --a and --b, e.g. a copy of
strata_lab/ holding the old _engine .so, and the checkout), the two builds alternating, --rounds times, each
timing --calls calls; with --caches N the calls rotate over N caches so each reads its cache from memory (16K
keys: 4 caches of 38 MB, more than the L3), with 1 the same cache again and again (2,048 keys: L3-resident, the
arithmetic alone). Printed: ns per (key, kv head) of wall time, fastest call, 10th percentile and median.
A shared machine preempts: compare the fastest calls, and only within one run.

    python benchmarks/kernels/q8_kernel_builds_ab.py --a /path/old --b $PWD [--context 2048] [--threads 1]
        [--level avx512bf16] [--caches 1] [--rounds 3] [--calls 300]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time


def child(args):
    import numpy as np
    from strata_lab._native import engine

    E = engine()

    H, Hkv, hd = 16, 8, 128
    rng = np.random.default_rng(0)
    caches = []
    for _ in range(args.caches):
        k8, ks = E._quantize_q8(rng.standard_normal((args.context, Hkv, hd), dtype=np.float32))
        v8, vs = E._quantize_q8(rng.standard_normal((args.context, Hkv, hd), dtype=np.float32))
        if hasattr(E, "_attention_q8_pages"):  # the engine's own layout, one array (s8), read in place
            from q8_decode_attention import _on_lines
            k8 = _on_lines(E._q8_pages(k8, ks, v8, vs))
        elif hasattr(E, "_q8_pages"):  # four arrays (s7), read in place (length=)
            from q8_decode_attention import _on_lines
            k8, ks = (_on_lines(a) for a in E._q8_pages(k8, ks, keys=True))
            v8, vs = (_on_lines(a) for a in E._q8_pages(v8, vs, keys=False))
        caches.append((k8, ks, v8, vs))
    kw = {"length": args.context} if hasattr(E, "_q8_pages") else {}
    q = rng.standard_normal((1, H, hd), dtype=np.float32)
    E.set_kernel_level(args.level)
    ts = []
    for i in range(args.calls + args.caches):
        k8, ks, v8, vs = caches[i % args.caches]
        t0 = time.perf_counter()
        if hasattr(E, "_attention_q8_pages"):
            E._attention_q8_pages(q, k8, H, Hkv, length=args.context, threads=args.threads)
        else:
            E._attention_q8(q, k8, ks, v8, vs, H, Hkv, threads=args.threads, **kw)
        if i >= args.caches:
            ts.append(time.perf_counter() - t0)
    ts = np.array(ts) * 1e9 / (args.context * Hkv)
    print(f"min {ts.min():.2f} p10 {np.percentile(ts, 10):.2f} med {np.median(ts):.2f}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", help="PYTHONPATH of build a")
    ap.add_argument("--b", help="PYTHONPATH of build b")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--level", default="avx512bf16")
    ap.add_argument("--caches", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    if not (args.a and args.b):
        ap.error("--a and --b are required")
    common = ["--context", str(args.context), "--threads", str(args.threads), "--level", args.level,
              "--caches", str(args.caches), "--calls", str(args.calls), "--child"]
    print(f"context {args.context}, threads {args.threads}, level {args.level}, caches {args.caches}, "
          f"{args.calls} calls per cell; ns per (key, kv head); load average {os.getloadavg()[0]:.1f}", flush=True)
    for rnd in range(args.rounds):
        for name, path in (("a", args.a), ("b", args.b)):
            out = subprocess.run([sys.executable, os.path.abspath(__file__), *common],
                                 env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True, check=True)
            print(f"round {rnd + 1} {name}: {out.stdout.strip()}", flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
