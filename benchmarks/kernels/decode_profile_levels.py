"""Where a decode step's time goes at each kernel level, on one held context (issue 32): the prompt is prefilled
once, then decoded again and again from the same held context (each generate cuts back to the prompt and reads
one token), the kernel level alternating call by call (set_kernel_level: avx2 is what an AVX2 + FMA machine
runs), with STRATA_PROFILE's per-op timers on. Prints tok/s per call and the per-op ms per token (median and
min over the rounds) per level, attention's share of the step, and whether every level decoded the same ids.

    PYTHONPATH=$PWD python benchmarks/kernels/decode_profile_levels.py [--context 16384] [--layers 2]
        [--levels avx2 avx512bf16] [--kv-cache q8] [--rounds 6] [--decode 16] [--out FILE.md]

The model is benchmarks/engine.py's random-weight Qwen3-0.6B-shaped folder (--layers of its 28), 2 threads.
A shared machine preempts: the levels alternate (ABAB, then BABA) and the load average is recorded.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("STRATA_PROFILE", "1")  # per-op timers (read before the module loads)

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine import model_folder  # noqa: E402  (benchmarks/engine.py: the cached model folder)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", type=int, default=16384)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--levels", nargs="+", default=["avx2", "avx512bf16"])
    ap.add_argument("--kv-cache", default="q8")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="also write the table to this markdown file")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.decode < 1 or args.context < 1:
        raise SystemExit("--rounds, --decode and --context must be positive")
    from tqdm import tqdm

    from strata_lab.engine import Engine, _ext

    E = _ext()
    best = E.kernel_level()
    order = ["scalar", "avx2", "avx512", "avx512bf16"]
    for lv in args.levels:
        if lv not in order or order.index(lv) > order.index(best):
            raise SystemExit(f"--levels: {lv!r} is not a kernel level this CPU runs (best: {best})")
    eng = Engine.load(model_folder("qwen3-0.6b", args.layers), threads=args.threads,
                      max_context=args.context + args.decode + 64, kv_cache=args.kv_cache)
    s = eng.session("profile")
    prompt = np.random.default_rng(0).integers(0, 151669, args.context).tolist()
    load0 = os.getloadavg()
    t = time.perf_counter()
    s.generate(prompt, max_new_tokens=1)
    prefill_s = time.perf_counter() - t
    tps = {lv: [] for lv in args.levels}
    ops: dict = {lv: {} for lv in args.levels}
    ids: dict = {}
    try:
        for rnd in tqdm(range(args.rounds), desc="rounds"):
            for lv in (args.levels if rnd % 2 == 0 else args.levels[::-1]):
                E.set_kernel_level(lv)
                E._profile(True)
                r = s.generate(prompt, max_new_tokens=args.decode).result
                d = E._profile(True)["decode"]
                assert r.tokens_read <= 1, r.tokens_read  # decoded from the held context
                ids.setdefault(lv, list(r.gen_ids))
                tps[lv].append(args.decode / (r.decode_ms / 1e3))
                for op, sec in d["seconds"].items():
                    ops[lv].setdefault(op, []).append(sec * 1e3 / max(1, d["tokens"]))
    finally:
        E.set_kernel_level(best)
    load1 = os.getloadavg()
    same = len({tuple(v) for v in ids.values()}) == 1
    names = sorted({op for lv in args.levels for op in ops[lv]},
                   key=lambda op: -float(np.median(ops[args.levels[0]].get(op, [0.0]))))
    names = [op for op in names if max(float(np.median(ops[lv].get(op, [0.0]))) for lv in args.levels) >= 0.01]
    lines = [f"decode step per op, {args.layers} layers of Qwen3-0.6B's shape, bf16 weights, kv cache "
             f"{args.kv_cache}, {args.context}-token held context, {args.decode} tokens per call, "
             f"{args.threads} threads, {args.rounds} rounds per level (alternating); prefill {prefill_s:.1f} s at "
             f"{best}; load average {load0[0]:.1f} at the start, {load1[0]:.1f} at the end; the same ids at "
             f"every level: {same}", "",
             "| level | decode tok/s per round | median | " + " | ".join(f"{op} ms/token median (min)" for op in names)
             + " | attention's share (medians) |",
             "|---|---|---:|" + "---:|" * len(names) + "---:|"]
    for lv in args.levels:
        med = {op: float(np.median(ops[lv].get(op, [0.0]))) for op in names}
        mn = {op: float(np.min(ops[lv].get(op, [0.0]))) for op in names}
        total = sum(med.values())
        lines.append(f"| {lv} | {' '.join(f'{x:.1f}' for x in tps[lv])} | {np.median(tps[lv]):.2f} | "
                     + " | ".join(f"{med[op]:.2f} ({mn[op]:.2f})" for op in names)
                     + f" | {100 * med.get('attention', 0.0) / total:.1f}% |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
