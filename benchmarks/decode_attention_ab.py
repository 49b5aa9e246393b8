"""Decode attention A/B in one process (issue 18): the streaming decode path (kernel option attn_decode on:
each thread walks the key tiles once for a contiguous run of kv heads, prefetching the next tile in address
order) against the one-task-per-kv-head decode it replaced (attn_decode off), one query against a 4K and a
16K f32 cache of Qwen3-0.6B's attention shape (16 query heads, 8 kv heads, head_dim 128), rounds alternating
the order of the two, on a shared machine: best wall time and median process CPU time (both threads' time
on a core; insensitive to time the threads spend preempted) per call.

    PYTHONPATH=$PWD python benchmarks/decode_attention_ab.py [--threads 2] [--rounds 8] [--out FILE.md]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--contexts", type=int, nargs="+", default=[4096, 16384])
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
    q = rng.standard_normal((1, H, hd), dtype=np.float32)
    wall: dict = {}
    cpu: dict = {}
    same = {}
    try:
        for rnd in range(args.rounds):
            for ctx in args.contexts:
                kk, vv = k[:ctx], v[:ctx]
                outs = {}
                for on in ((False, True) if rnd % 2 == 0 else (True, False)):
                    E._set_kernel_option("attn_decode", on)
                    reps = max(2, 65536 // ctx)
                    w0, c0 = time.perf_counter(), time.process_time()
                    for _ in range(reps):
                        outs[on] = E._attention(q, kk, vv, H, Hkv, threads=args.threads)
                    wall.setdefault((ctx, on), []).append((time.perf_counter() - w0) / reps)
                    cpu.setdefault((ctx, on), []).append((time.process_time() - c0) / reps)
                same[ctx] = same.get(ctx, True) and np.array_equal(outs[False], outs[True])
    finally:
        E._set_kernel_option("attn_decode", True)
    lines = [f"decode attention, 1 query, H={H} Hkv={Hkv} hd={hd}, {args.threads} threads, {args.rounds} alternating "
             f"rounds, kernels {E.kernel_level()}", "",
             "| context | cache MiB | wall best old ms | wall best new ms | old/new | GB/s new | cpu median old ms "
             "| cpu median new ms | old/new | bits equal |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for ctx in args.contexts:
        mib = 2 * ctx * Hkv * hd * 4 / 2**20
        wo, wn = min(wall[(ctx, False)]), min(wall[(ctx, True)])
        co, cn = float(np.median(cpu[(ctx, False)])), float(np.median(cpu[(ctx, True)]))
        lines.append(f"| {ctx} | {mib:.0f} | {wo * 1e3:.2f} | {wn * 1e3:.2f} | {wo / wn:.2f} | "
                     f"{mib * 2**20 / wn / 1e9:.1f} | {co * 1e3:.2f} | {cn * 1e3:.2f} | {co / cn:.2f} | {same[ctx]} |")
    bw = E.read_bandwidth(2 * T * Hkv * hd * 4, args.threads, 3)
    lines += ["", f"read loop over the {T}-key cache's bytes, {args.threads} threads, right after: {bw:.1f} GB/s"]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
