"""A/B of decode-step implementations in one process, interleaved round by round, so a shared machine's
load changes hit every variant alike: (int8 weights) integer dots against int8-quantised activations vs
weights widened to f32, and decode attention streaming the cache vs one task per kv head; also each
variant's fraction of a read loop over the streamed bytes. The switches whose A/B was decided (linear
prefetch, releasing OpenMP teams, the line-cursor and first-tile attention prefetch, the decode loop's
pool, even/odd, 8-row, run and memory-order switches) are gone with their losing code;
benchmarks/results/history.md ("Kernel switches") keeps their numbers.

    PYTHONPATH=$PWD python benchmarks/kernels/ab_decode.py [--rounds 6] [--steps 4] [--threads 2] [--weights int8]
        [--variants "int8 widening"]  (the default and the variants whose names contain one of these)
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

DEFAULT = "default"
_BASE = {"int8_dot": True, "attn_decode": True}
VARIANTS = {
    DEFAULT: _BASE,
    "int8 widening to f32 (before int8_dot)": {**_BASE, "int8_dot": False},
    "decode attention one task per kv head (before attn_decode)": {**_BASE, "attn_decode": False},
}


def main(argv=None):
    from engine import model_folder  # benchmarks/engine.py
    from strata_lab.engine import Engine, _ext

    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen3-0.6b")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=4, help="decode steps per variant per round")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--weights", default=None)
    ap.add_argument("--variants", nargs="*", default=None,
                    help="run only the default and the variants whose names contain one of these strings")
    args = ap.parse_args(argv)
    variants = {k: v for k, v in VARIANTS.items()
                if k == DEFAULT or args.variants is None or any(p in k for p in args.variants)}
    ext = _ext()
    eng = Engine.load(model_folder(args.preset), threads=args.threads, weights=args.weights)
    s = eng.session("ab")
    s.generate(np.random.default_rng(0).integers(0, 151669, 64).tolist(), max_new_tokens=0)
    times = {k: [] for k in variants}
    bws = []
    for rnd in range(args.rounds):
        bws.append(ext.read_bandwidth(eng.info["stream_bytes"], args.threads, 1))
        names = list(variants)
        for name in names[rnd % len(names):] + names[:rnd % len(names)]:  # rotate the order
            opts = variants[name]
            for k, v in opts.items():
                ext._set_kernel_option(k, v)
            s.generate(s.held_ids, max_new_tokens=1)  # settle
            t0 = time.perf_counter()
            s.generate(s.held_ids, max_new_tokens=args.steps)
            times[name].append((time.perf_counter() - t0) / args.steps)
        print(f"round {rnd}: " + ", ".join(f"#{i} {v[-1] * 1e3:.0f} ms" for i, v in enumerate(times.values())),
              flush=True)
    for k, v in VARIANTS[DEFAULT].items():
        ext._set_kernel_option(k, v)
    limit = statistics.median(bws) * 1e9 / eng.info["stream_bytes"]
    base = statistics.median(times[DEFAULT])
    print(f"read loop {statistics.median(bws):.1f} GB/s over {eng.info['stream_bytes'] / 1e9:.2f} GB -> "
          f"limit {limit:.2f} tok/s")
    for name, v in times.items():
        m = statistics.median(v)
        print(f"  #{list(times).index(name)} {name:45s} {1 / m:6.2f} tok/s  x{base / m:4.2f} of default time  {1 / m / limit:.2f} of limit")


if __name__ == "__main__":
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
    main()
