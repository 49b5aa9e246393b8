"""Decode attention A/B in one process (issue 18): one query against a 4K and a 16K cache of Qwen3-0.6B's
attention shape (16 query heads, 8 kv heads, head_dim 128), a kernel option off (old) against on (new), for
an f32 and an f16 cache (the f16 arrays passed as they are: the kernel, not the rounding, is timed).

--option attn_decode: the streaming decode path (each thread walks the key tiles once for a contiguous run
of kv heads) against one task per kv head. (The attn_pf_lines A/B, line-cursor prefetch against whole rows
per score step, was decided and its switch deleted: benchmarks/results/history.md.)

Rounds alternate the order of the variants, on a shared machine, so only ratios of medians mean anything:
per call, the median wall time and the median process CPU time (both threads' time on a core; insensitive
to time the threads spend preempted). Each round also times a read loop (read_bandwidth) over each cache's
bytes; "of read loop" is the read loop's median time over the cache bytes divided by the call's median wall
time (1.0: decode attention reads the cache as fast as a plain read loop does).

    PYTHONPATH=$PWD python benchmarks/kernels/decode_attention_ab.py [--option attn_decode] [--threads 2] [--rounds 8]
        [--caches f32 f16] [--out FILE.md]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--option", default="attn_decode", choices=["attn_decode"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--contexts", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--caches", nargs="+", default=["f32", "f16"], choices=["f32", "f16"])
    ap.add_argument("--heads", type=int, nargs=3, default=[16, 8, 128], metavar=("H", "HKV", "HD"))
    ap.add_argument("--out", default=None, help="also write the table to this markdown file")
    args = ap.parse_args(argv)
    from strata_lab.engine import _ext

    E = _ext()
    H, Hkv, hd = args.heads
    rng = np.random.default_rng(0)
    T = max(args.contexts)
    k = rng.standard_normal((T, Hkv, hd), dtype=np.float32)
    v = rng.standard_normal((T, Hkv, hd), dtype=np.float32)
    kv = {"f32": (k, v), "f16": (k.astype(np.float16), v.astype(np.float16))}
    q = rng.standard_normal((1, H, hd), dtype=np.float32)
    opt = args.option
    was = E._kernel_option(opt)
    wall: dict = {}
    cpu: dict = {}
    read: dict = {}
    same: dict = {}
    try:
        for rnd in range(args.rounds):
            for ctx in args.contexts:
                for cache in args.caches:
                    kk, vv = kv[cache][0][:ctx], kv[cache][1][:ctx]
                    outs = {}
                    for on in ((False, True) if rnd % 2 == 0 else (True, False)):
                        E._set_kernel_option(opt, on)
                        reps = max(2, 32768 // ctx)
                        w0, c0 = time.perf_counter(), time.process_time()
                        for _ in range(reps):
                            outs[on] = E._attention(q, kk, vv, H, Hkv, threads=args.threads)
                        wall.setdefault((ctx, cache, on), []).append((time.perf_counter() - w0) / reps)
                        cpu.setdefault((ctx, cache, on), []).append((time.process_time() - c0) / reps)
                    same[(ctx, cache)] = same.get((ctx, cache), True) and np.array_equal(outs[False], outs[True])
                    nbytes = kk.nbytes + vv.nbytes
                    read.setdefault((ctx, cache), []).append(nbytes / (E.read_bandwidth(nbytes, args.threads, 1) * 1e9))
    finally:
        E._set_kernel_option(opt, was)
    med = lambda xs: float(np.median(xs))  # noqa: E731
    lines = [f"decode attention, 1 query, H={H} Hkv={Hkv} hd={hd}, {args.threads} threads, {args.rounds} alternating "
             f"rounds, kernels {E.kernel_level()}; old = {opt} off, new = {opt} on", "",
             "| context | cache | MiB | wall median old ms | new ms | old/new | cpu median old ms | new ms | old/new "
             "| of read loop old | new | bits equal |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for ctx in args.contexts:
        for cache in args.caches:
            mib = 2 * ctx * Hkv * hd * (4 if cache == "f32" else 2) / 2**20
            wo, wn = med(wall[(ctx, cache, False)]), med(wall[(ctx, cache, True)])
            co, cn = med(cpu[(ctx, cache, False)]), med(cpu[(ctx, cache, True)])
            rd = med(read[(ctx, cache)])
            lines.append(f"| {ctx} | {cache} | {mib:.0f} | {wo * 1e3:.2f} | {wn * 1e3:.2f} | {wo / wn:.2f} | "
                         f"{co * 1e3:.2f} | {cn * 1e3:.2f} | {co / cn:.2f} | {rd / wo:.2f} | {rd / wn:.2f} | "
                         f"{same[(ctx, cache)]} |")
    if {"f32", "f16"} <= set(args.caches):
        lines += ["", "f32 cache / f16 cache, wall median (new): " + ", ".join(
            f"{ctx}: {med(wall[(ctx, 'f32', True)]) / med(wall[(ctx, 'f16', True)]):.2f}" for ctx in args.contexts)]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
