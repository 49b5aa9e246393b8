"""Decode attention over a q8 KV cache, the kernel alone, at every vector level of this CPU in one process
(issue 32): one query (n = 1) against a --contexts-key cache of Qwen3-0.6B's attention shape (16 query heads,
8 kv heads, head_dim 128) held as the engine holds it (int8 blocks of 32, an f16 scale each, _quantize_q8; in
pages of 64 positions kv head by kv head, _q8_pages, on 64-byte lines as the engine's cache), through
_attention_q8_pages (nothing quantised or copied per call).

The levels run the same kernel body: avx2 takes the scores with maddubs/madd and P V in 256-bit registers;
avx512 and avx512bf16 take the scores with VNNI (vpdpbusd, where the CPU has it) and P V in 512-bit registers.
Their outputs are bit for bit equal (checked here, and in tests/test_kv_q8.py).

A shared machine preempts: rounds alternate the level order, each call is timed on its own, and the table
gives the fastest call (min) and the median, in ns per (key, kv head) of wall time, and the cache bytes over the
fastest call's time. The read loop (read_bandwidth) over the same bytes is timed in each round as a reference.

    PYTHONPATH=$PWD python benchmarks/kernels/q8_decode_attention.py [--contexts 2048 16384] [--threads 1 2]
        [--rounds 4] [--calls 40] [--out FILE.md]
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np


def _on_lines(a, line=64):
    """a copy of a starting on a cache line (the engine's KV arrays do: state.h kv_alloc)"""
    buf = np.empty(a.nbytes + line, np.uint8)
    o = -buf.ctypes.data % line
    out = buf[o:o + a.nbytes].view(a.dtype)
    out[:] = a
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", type=int, nargs="+", default=[2048, 16384])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--calls", type=int, default=40, help="timed calls per level, context, thread count and round")
    ap.add_argument("--heads", type=int, nargs=3, default=[16, 8, 128], metavar=("H", "HKV", "HD"))
    ap.add_argument("--out", default=None, help="also write the table to this markdown file")
    args = ap.parse_args(argv)
    from strata_lab.engine import _ext

    E = _ext()
    H, Hkv, hd = args.heads
    best = E.kernel_level()
    order = ["avx2", "avx512", "avx512bf16"]
    if best not in order:
        raise SystemExit(f"this CPU's best kernel level is {best}: no vector level to time")
    levels = order[: order.index(best) + 1]
    rng = np.random.default_rng(0)
    T = max(args.contexts)
    k8, ks = E._quantize_q8(rng.standard_normal((T, Hkv, hd), dtype=np.float32))
    v8, vs = E._quantize_q8(rng.standard_normal((T, Hkv, hd), dtype=np.float32))
    pages = {ctx: _on_lines(E._q8_pages(k8[:ctx], ks[:ctx], v8[:ctx], vs[:ctx])) for ctx in args.contexts}
    q = rng.standard_normal((1, H, hd), dtype=np.float32)
    times: dict = {}
    read: dict = {}
    outs: dict = {}
    try:
        for rnd in range(args.rounds):
            for ctx in args.contexts:
                arrs = pages[ctx]
                nbytes = arrs.nbytes * ctx // (-(-ctx // 64) * 64)  # int8 values and an f16 scale per 32
                for th in args.threads:
                    for lv in (levels if rnd % 2 == 0 else levels[::-1]):
                        E.set_kernel_level(lv)
                        for _ in range(args.calls):
                            t0 = time.perf_counter()
                            o = E._attention_q8_pages(q, arrs, H, Hkv, length=ctx, threads=th)
                            times.setdefault((ctx, th, lv), []).append(time.perf_counter() - t0)
                        outs.setdefault((ctx, th, lv), o)
                    read.setdefault((ctx, th), []).append(nbytes / (E.read_bandwidth(nbytes, th, 1) * 1e9))
    finally:
        E.set_kernel_level(best)
    same = all(np.array_equal(outs[(c, t, lv)], outs[(c, t, "avx2")]) for c in args.contexts for t in args.threads
               for lv in levels)
    load = os.getloadavg()[0]
    lines = [f"decode attention over a q8 cache, kernel alone: 1 query, H={H} Hkv={Hkv} hd={hd}, {args.rounds} rounds "
             f"x {args.calls} calls per cell, levels {', '.join(levels)} (best {best}); load average {load:.1f} at "
             f"the end; outputs bit-equal across levels: {same}", "",
             "| context | threads | level | min ns/(key, kv head) | median | GB/s at min | read loop GB/s (min) "
             "| min vs avx2 | median vs avx2 |", "|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for ctx in args.contexts:
        nbytes = 2 * ctx * Hkv * hd * (1 + 4 / 32)
        for th in args.threads:
            base = times[(ctx, th, "avx2")]
            for lv in levels:
                t = np.asarray(times[(ctx, th, lv)])
                per = 1e9 / (ctx * Hkv)
                lines.append(f"| {ctx} | {th} | {lv} | {t.min() * per:.2f} | {np.median(t) * per:.2f} | "
                             f"{nbytes / t.min() / 1e9:.1f} | {nbytes / min(read[(ctx, th)]) / 1e9:.1f} | "
                             f"{min(base) / t.min():.2f} | {np.median(base) / np.median(t):.2f} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
