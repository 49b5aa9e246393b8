"""One-token decode attention over an f16 KV cache on 4 KiB pages against the same cache on transparent huge
pages (issue 32): Qwen3-0.6B's shape (16 query heads, 8 kv heads, head_dim 128), --layers separate caches
([context, 8, 128] float16 K and V each, as AttentionKV holds them), one _attention call per layer per step,
a 64 MiB pass over another array between steps so no call finds its cache warm.

"4k": each layer's K and V its own numpy array with numpy's huge-page advice turned off (the engine's cache
before STRATA_KV_HUGEPAGES: std::vector on 4 KiB pages, 16 bytes past a cache line as malloc leaves it, as
numpy's are); "4k64": the same arrays each starting on a 64-byte cache line (as the engine's arrays under
2 MiB now do: 64-byte aligned malloc); "huge": all layers in one array, advised (numpy advises arrays of
>= 4 MiB), still 16 bytes past a line; "huge64": the same with every row starting on a cache line (as the
engine's >= 2 MiB arrays now do: a 2 MiB-aligned mapping advised before first touch).
Rounds rotate the order; each cell is the median of --steps steps. With --threads 1 the time is the
thread's CPU time (time.thread_time: the work, not the wait for a core another process holds), else wall
time. Outputs are compared bit for bit; the load average is printed: on a shared machine only ratios in one
run mean anything.

    PYTHONPATH=$PWD python benchmarks/kernels/kv_pages_attention.py [--contexts 256 1024] [--threads 1 2]
        [--rounds 8] [--steps 5] [--layers 28]
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np


def _on_line(a):
    """A copy of a in a new array whose data starts on a 64-byte cache line (a view into a slightly larger one)."""
    raw = np.empty(a.size + 64, a.dtype)
    off = (-raw.ctypes.data % 64) // a.itemsize
    out = raw[off:off + a.size].reshape(a.shape)
    out[:] = a
    assert out.ctypes.data % 64 == 0
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--layers", type=int, default=28)
    args = ap.parse_args(argv)
    if min(args.threads) < 1 or args.rounds < 1 or args.steps < 1 or args.layers < 1:
        raise SystemExit("--threads, --rounds, --steps and --layers must be >= 1")
    from numpy._core import multiarray

    from strata_lab.engine import _ext

    E = _ext()
    H, Hkv, hd, L = 16, 8, 128, args.layers
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, H, hd), dtype=np.float32) * 3
    flush = np.ones(64 << 18, dtype=np.float32)
    print(f"kernels {E.kernel_level()}, load average {os.getloadavg()[0]:.1f} at the start", flush=True)
    for ctx in args.contexts:
        src = rng.standard_normal((L, 2, ctx, Hkv, hd), dtype=np.float32).astype(np.float16)
        was = multiarray._get_madvise_hugepage()
        try:
            multiarray._set_madvise_hugepage(False)
            small, small64 = [], []
            for i in range(L):
                k, v = np.empty((ctx, Hkv, hd), np.float16), np.empty((ctx, Hkv, hd), np.float16)
                k[:], v[:] = src[i, 0], src[i, 1]
                small.append((k, v))
                small64.append((_on_line(src[i, 0]), _on_line(src[i, 1])))
            multiarray._set_madvise_hugepage(True)
            blk = np.empty(src.shape, np.float16)
            blk[:] = src
            blk64 = _on_line(src)
        finally:
            multiarray._set_madvise_hugepage(was)
        assert small[0][0].ctypes.data % 64 != 0 and blk.ctypes.data % 64 != 0, "numpy's arrays are on a line here"
        caches = {"4k": small, "4k64": small64, "huge": [(blk[i, 0], blk[i, 1]) for i in range(L)],
                  "huge64": [(blk64[i, 0], blk64[i, 1]) for i in range(L)]}
        mb = src.nbytes / 1e6
        for th in args.threads:
            clock = time.thread_time if th == 1 else time.perf_counter
            res = {name: [] for name in caches}
            outs = {}
            names = list(caches)
            for rnd in range(args.rounds):
                for name in names[rnd % len(names):] + names[:rnd % len(names)]:
                    ts = []
                    for _ in range(args.steps):
                        flush.sum()
                        t0 = clock()
                        for k, v in caches[name]:
                            o = E._attention(q, k, v, H, Hkv, threads=th)
                        ts.append(clock() - t0)
                    outs[name] = o
                    res[name].append(float(np.median(ts)))
            same = all(np.array_equal(outs["4k"], o) for o in outs.values())
            med = {n: float(np.median(r)) for n, r in res.items()}
            best = {n: min(r) for n, r in res.items()}
            print(f"context {ctx}, {th} thread(s) ({'CPU' if th == 1 else 'wall'} time), {mb:.1f} MB of cache: "
                  + ", ".join(f"{n} {med[n] * 1e3:.2f} ms (best {best[n] * 1e3:.2f}, {mb / med[n] / 1e3:.1f} GB/s)"
                              for n in caches)
                  + "; 4k / variant: "
                  + ", ".join(f"{n} median {med['4k'] / med[n]:.2f}x best {best['4k'] / best[n]:.2f}x"
                              for n in names[1:])
                  + "; "
                  f"bits equal: {same}; load average {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
