"""One-token decode attention over an f16 KV cache as a decode step meets it (issue 32): Qwen3-0.6B's shape
(16 query heads, 8 kv heads, head_dim 128) and --layers separate caches (28: each layer's K and V arrays of
[context, 8, 128] float16, as AttentionKV holds them), one _attention call per layer per step, so each call
reads its cache from memory rather than from a cache warmed by the call before (a step's other reads, the
weights, evict it; here a 64 MiB pass over another array between steps does).

A/B of a kernel option (--option; attn_decode: each thread a contiguous run of kv heads walking the key
tiles with software prefetch, against one task per kv head) in the same process: rounds alternate the order
of the variants; each variant's cell is the median of --steps steps; the table gives the median over
rounds of those and the fastest step, as GB/s of cache bytes (all layers' K and V) and as a fraction of the
read loop (read_bandwidth, the same threads, over the same number of bytes, once per round). Outputs of the
two variants are compared bit for bit. Shared machine: the load average is printed; only ratios in one run
mean anything.

    PYTHONPATH=$PWD python benchmarks/kernels/f16_decode_attention.py [--option attn_decode]
        [--contexts 256 1024 4096] [--threads 2] [--rounds 6] [--steps 6] [--layers 28] [--out FILE.md]

(A split of the keys over threads, --option attn_split, was tried with it and deleted: 0.65-0.72x;
benchmarks/results/history.md, "Runs kept in git".)
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--option", default="attn_decode", help="the kernel switch to time on against off")
    ap.add_argument("--contexts", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=6, help="timed steps per variant, context and round")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--heads", type=int, nargs=3, default=[16, 8, 128], metavar=("H", "HKV", "HD"))
    ap.add_argument("--out", default=None, help="also write the table to this markdown file")
    args = ap.parse_args(argv)
    for name in ("threads", "rounds", "steps", "layers"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name} must be >= 1")
    from strata_lab.engine import _ext

    E = _ext()
    opt = args.option
    was = E._kernel_option(opt)  # an unknown switch raises, before any work
    H, Hkv, hd = args.heads
    rng = np.random.default_rng(0)
    T = max(args.contexts)
    caches = [(rng.standard_normal((T, Hkv, hd), dtype=np.float32).astype(np.float16),
               rng.standard_normal((T, Hkv, hd), dtype=np.float32).astype(np.float16)) for _ in range(args.layers)]
    q = rng.standard_normal((1, H, hd), dtype=np.float32) * 3
    flush = np.ones(64 << 18, dtype=np.float32)  # 64 MiB
    step: dict = {}
    read: dict = {}
    same = True
    load0 = os.getloadavg()[0]
    try:
        for rnd in range(args.rounds):
            for ctx in args.contexts:
                views = [(np.ascontiguousarray(k[:ctx]), np.ascontiguousarray(v[:ctx])) for k, v in caches]
                nbytes = sum(k.nbytes + v.nbytes for k, v in views)
                outs = {}
                for on in ((False, True) if rnd % 2 == 0 else (True, False)):
                    E._set_kernel_option(opt, on)
                    ts = []
                    for _ in range(args.steps):
                        flush.sum()
                        t0 = time.perf_counter()
                        for k, v in views:
                            o = E._attention(q, k, v, H, Hkv, threads=args.threads)
                        ts.append(time.perf_counter() - t0)
                    outs[on] = o
                    step.setdefault((ctx, on), []).append(ts)
                same = same and np.array_equal(outs[True], outs[False])
                read.setdefault(ctx, []).append(E.read_bandwidth(nbytes, args.threads, 1))
                del views
    finally:
        E._set_kernel_option(opt, was)
    load1 = os.getloadavg()[0]
    lines = [f"decode attention over an f16 cache, {args.layers} layers x (1 query, H={H} Hkv={Hkv} hd={hd}) per "
             f"step, {args.threads} threads, {args.rounds} alternating rounds x {args.steps} steps, kernels "
             f"{E.kernel_level()}; load average {load0:.1f} at the start, {load1:.1f} at the end; outputs of "
             f"{opt} on and off bit-equal: {same}", "",
             f"| context | cache MB (all layers) | read loop GB/s (median) | {opt} | step ms (median of round "
             "medians) | GB/s | of read loop | fastest step ms | GB/s | on vs off (median) |",
             "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for ctx in args.contexts:
        nbytes = 2 * args.layers * ctx * Hkv * hd * 2
        rd = float(np.median(read[ctx]))
        med = {on: float(np.median([np.median(r) for r in step[(ctx, on)]])) for on in (True, False)}
        for on in (False, True):
            best = min(min(r) for r in step[(ctx, on)])
            lines.append(f"| {ctx} | {nbytes / 1e6:.1f} | {rd:.1f} | {'on' if on else 'off'} | {med[on] * 1e3:.3f} | "
                         f"{nbytes / med[on] / 1e9:.1f} | {nbytes / med[on] / 1e9 / rd:.2f} | {best * 1e3:.3f} | "
                         f"{nbytes / best / 1e9:.1f} | {med[False] / med[True]:.2f}x |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
