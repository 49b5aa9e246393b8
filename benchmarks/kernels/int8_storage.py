"""int8-stored model folders against bf16 ones: file size and Engine.load time.

    PYTHONPATH=$PWD python benchmarks/kernels/int8_storage.py [--arch qwen3_next] [--preset bench] [--reps 5] [--untied]

The same random weights are written twice by make_tiny: bf16, and ``weights="int8"`` (docs/ENGINE.md
"int8 model folders": I8 matrices + F32 per-row scales, embeddings and norms bf16). Loads, interleaved
rounds, medians (page cache warm for both: one untimed load each first):
- bf16 folder, weights="int8": the quantise-at-load path (reads every matrix, converts, quantises);
- int8 folder, weights="int8": the same int8 model read straight from the file (only the tied lm_head,
  if any, is quantised at load);
- both folders with stored weights, mmap (views only) and with mmap=False (the files read into memory).
Printed as int8/bf16 ratios within this one run, plus a check that the two int8 models give the same logits.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np


def main(argv=None) -> None:
    from strata_lab.engine import Engine
    from strata_lab.tiny import make_tiny

    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="qwen3_next")
    ap.add_argument("--preset", default="bench")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--untied", action="store_true", help="tie_word_embeddings=False: an int8 lm_head in the folder")
    args = ap.parse_args(argv)
    ov = dict(tie_word_embeddings=False) if args.untied else None
    tmp = tempfile.TemporaryDirectory()
    t = time.perf_counter()
    bf16 = make_tiny(f"{tmp.name}/bf16", args.arch, args.preset, seed=1, dtype="bfloat16", overrides=ov)
    t_bf16 = time.perf_counter() - t
    t = time.perf_counter()
    i8 = make_tiny(f"{tmp.name}/i8", args.arch, args.preset, seed=1, dtype="bfloat16", overrides=ov,
                   weights="int8")
    t_i8 = time.perf_counter() - t
    size = {p: sum(f.stat().st_size for f in p.glob("*.safetensors")) for p in (bf16, i8)}

    cases = {"bf16 folder, weights=int8 (quantise at load)": (bf16, dict(weights="int8")),
             "int8 folder, weights=int8 (read as stored)": (i8, dict(weights="int8")),
             "bf16 folder, stored, mmap": (bf16, {}),
             "int8 folder, stored, mmap": (i8, {}),
             "bf16 folder, stored, mmap=False": (bf16, dict(mmap=False)),
             "int8 folder, stored, mmap=False": (i8, dict(mmap=False))}
    times: dict[str, list[float]] = {k: [] for k in cases}
    for rep in range(args.reps + 1):  # round 0 warms the page cache
        for name, (path, kw) in cases.items():
            t = time.perf_counter()
            eng = Engine.load(path, threads=args.threads, **kw)
            dt = time.perf_counter() - t
            del eng
            if rep:
                times[name].append(dt)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    ids = [int(i) for i in np.random.default_rng(0).integers(0, 151643, 8)]
    same = np.array_equal(Engine.load(bf16, threads=args.threads, weights="int8").forward(ids),
                          Engine.load(i8, threads=args.threads, weights="int8").forward(ids))

    print(f"{args.arch} {args.preset}{' (untied lm_head)' if args.untied else ' (tied lm_head: quantised at load)'}: int8-stored vs bf16 folder (same weights), medians of {args.reps} loads")
    print(f"files: bf16 {size[bf16] / 2**20:.1f} MiB, int8 {size[i8] / 2**20:.1f} MiB: int8/bf16 x{size[i8] / size[bf16]:.3f}"
          f" (written in {t_bf16:.1f}s / {t_i8:.1f}s)")
    print("| load | ms |\n|---|---:|")
    for k, v in med.items():
        print(f"| {k} | {v:.1f} |")
    q_old, q_new = med["bf16 folder, weights=int8 (quantise at load)"], med["int8 folder, weights=int8 (read as stored)"]
    print(f"int8 model load: from the int8 folder x{q_old / q_new:.1f} faster than quantising the bf16 folder at load; "
          f"logits bit-identical: {same}")
    print(f"read into memory (mmap=False): int8/bf16 time x"
          f"{med['int8 folder, stored, mmap=False'] / med['bf16 folder, stored, mmap=False']:.2f}")
    tmp.cleanup()


if __name__ == "__main__":
    main()
