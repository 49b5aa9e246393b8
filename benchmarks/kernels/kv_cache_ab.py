"""Engine-level decode A/B of the KV cache in one process (issue 18): the random Qwen3-0.6B-shaped bf16
model folder with --layers of its 28 layers, one engine with an f32 cache (Engine.load kv_cache="f32") and one
with the default ("auto": f16 for bf16 weights), each holding the same --context-token prompt; then rounds
alternating their order decode --steps tokens from the held prompt (the cache cut back to the prompt each
time).
Prints median decode tok/s of each and the ratios. A 16K prompt takes about a minute per engine to prefill
with 2 layers on 2 cores.

    PYTHONPATH=$PWD python benchmarks/kernels/kv_cache_ab.py [--context 4096] [--layers 2] [--rounds 6] [--steps 8]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="qwen3-0.6b")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
    from engine import model_folder  # benchmarks/engine.py
    from strata_lab.engine import Engine

    path = model_folder(args.preset, args.layers)
    engines = {c: Engine.load(path, threads=args.threads, max_context=args.context + args.steps + 8, kv_cache=c)
               for c in ("f32", "auto")}
    prompt = np.random.default_rng(0).integers(0, 151000, args.context).tolist()
    sessions = {}
    for c, eng in engines.items():
        t0 = time.perf_counter()
        sessions[c] = eng.session("ab")
        sessions[c].generate(prompt, max_new_tokens=1).result
        print(f"kv_cache={c!r} ({eng.info['kv_cache']}): prefill {time.perf_counter() - t0:.1f} s", flush=True)
    names = {"f32": "f32 cache", "auto": f"{engines['auto'].info['kv_cache']} cache (auto)"}
    rates: dict = {k: [] for k in names}
    order = list(names)
    for rnd in range(args.rounds):
        for k in order if rnd % 2 == 0 else order[::-1]:
            r = sessions[k].generate(prompt, max_new_tokens=args.steps).result
            rates[k].append(args.steps / (r.decode_ms / 1e3))
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"{args.preset}, {args.layers} layers, context {args.context}, {args.threads} threads, {args.rounds} "
          f"alternating rounds of {args.steps} decode steps; median tok/s:")
    for k, name in names.items():
        print(f"  {name:34s} {med[k]:7.1f}")
    print(f"  auto / f32: x{med['auto'] / med['f32']:.2f}")


if __name__ == "__main__":
    main()
