"""Old vs new attention kernel, A/B in one process: the tiled AVX2 kernel (key tiles, online softmax, GQA
heads sharing K/V loads) against the per-query scalar loop it replaced (_set_kernel_option("attn_tiled",
False)), on one layer of Qwen3-0.6B's shape (16 query heads, 8 kv heads, head_dim 128), interleaved rounds,
best time of each.

    PYTHONPATH=$PWD python benchmarks/kernels/attention_ab.py [--threads 2] [--rounds 3] [--out benchmarks/results/long_context]

Cases: prefill of a whole 4K prompt (4096 queries, causal); the last --tail queries of a 16K prefill
(queries at positions 16384 - tail .. 16383: the per-query cost at 16K context, without the hour the old
kernel needs for all 16K queries of all 28 layers on 2 cores); one decode step at 16K context. Prints and
writes attention_ab.md: time per call, ratio old/new, and the new kernel's GFLOP/s (4 hd flops per visible
query-key pair per head).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tail", type=int, default=256, help="queries timed at the end of the 16K prefill")
    ap.add_argument("--heads", type=int, nargs=3, default=[16, 8, 128], metavar=("H", "HKV", "HD"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "long_context"))
    args = ap.parse_args(argv)
    from strata_lab.engine import _ext

    E = _ext()
    H, Hkv, hd = args.heads
    rng = np.random.default_rng(0)
    T = 16384
    k = rng.standard_normal((T, Hkv, hd), dtype=np.float32)
    v = rng.standard_normal((T, Hkv, hd), dtype=np.float32)
    q = rng.standard_normal((4096, H, hd), dtype=np.float32)
    cases = [  # name, queries, context (cache rows), visible query-key pairs
        ("prefill 4K (4096 queries)", 4096, 4096, 4096 * 4097 // 2),
        (f"prefill 16K, last {args.tail} queries", args.tail, T, sum(range(T - args.tail + 1, T + 1))),
        ("decode at 16K (1 query)", 1, T, T),
    ]
    best = {}
    for rnd in range(args.rounds):
        for name, n, ctx, pairs in cases:
            for tiled in (True, False):
                E._set_kernel_option("attn_tiled", tiled)
                reps = 20 if n == 1 else 1
                t0 = time.perf_counter()
                for _ in range(reps):
                    out = E._attention(q[:n], k[:ctx], v[:ctx], H, Hkv, threads=args.threads)
                dt = (time.perf_counter() - t0) / reps
                key = (name, tiled)
                best[key] = min(best.get(key, np.inf), dt)
                print(f"  round {rnd} {name:36s} {'tiled' if tiled else 'old  '} {dt * 1e3:9.2f} ms", flush=True)
            E._set_kernel_option("attn_tiled", True)
    lines = [f"attention kernel A/B, one layer (H {H}, kv heads {Hkv}, head_dim {hd}), {args.threads} threads, "
             f"kernels {E.kernel_level()}, best of {args.rounds} interleaved rounds", "",
             "| case | old (per-query scalar) ms | new (tiled AVX2) ms | old / new | new GFLOP/s |",
             "|---|---:|---:|---:|---:|"]
    for name, n, ctx, pairs in cases:
        a, b = best[(name, False)], best[(name, True)]
        lines.append(f"| {name} | {a * 1e3:.1f} | {b * 1e3:.1f} | {a / b:.2f} | {4 * hd * H * pairs / b / 1e9:.1f} |")
    text = "\n".join(lines)
    print("\n" + text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "attention_ab.md").write_text(text + "\n")
    print(f"wrote {out / 'attention_ab.md'}")


if __name__ == "__main__":
    main()
