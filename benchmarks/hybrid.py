"""Hybrid (Qwen3-Next) engine costs: GDN vs attention decode cost against context, snapshot cost, prefill.

    PYTHONPATH=$PWD python benchmarks/hybrid.py [--contexts 128 512 1536] [--decode 16]

Builds the "bench" preset of make_tiny_next (a scaled Qwen3-Next: 6 GDN + 2 gated-attention layers,
MoE 16 experts top-4 + shared expert, real Qwen vocab), then:
1. per-token decode time of the GDN mixers and of the attention mixers at growing context lengths
   (GDN state is fixed-size, so its cost is flat; attention reads a KV cache that grows);
2. time and MiB per recurrent-state snapshot (and the same size formula at the 80B-A3B shape);
3. prefill tokens/s.
"""
from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np


def main(argv=None) -> None:
    from strata_lab._tiny_next import NEXT_PRESETS, make_tiny_next
    from strata_lab.next_model import CheckpointPolicy, NextEngine

    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", type=int, nargs="+", default=[128, 512, 1536])
    ap.add_argument("--decode", type=int, default=16)
    args = ap.parse_args(argv)
    shape = NEXT_PRESETS["bench"]
    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        path = make_tiny_next(d, preset="bench", dtype="bfloat16")
        eng = NextEngine.load(path)
        print(f"bench preset built+loaded in {time.perf_counter() - t:.1f}s")
    n_gdn = sum(t == "linear_attention" for t in shape.layer_types())
    n_att = shape.num_hidden_layers - n_gdn
    rng = np.random.default_rng(0)
    ids = [int(i) for i in rng.integers(0, 151000, max(args.contexts))]
    # default policy: the snapshot at each prompt end lets the next, longer prompt skip the decoded ids
    s = eng.session(CheckpointPolicy())
    nat = eng._native
    rows, held, prefill_tok, prefill_s = [], 0, 0, 0.0
    for ctx in args.contexts:
        r = s.generate(ids[:ctx])  # restores the previous prompt-end checkpoint, reads only the new part
        prefill_tok += r.read
        prefill_s += r.prefill_ms / 1e3
        # one decode step per call so each sample is timed alone; medians resist a busy machine
        gs, as_, toks = [], [], []
        for _ in range(args.decode):
            nat.reset_timers()
            r = s.generate(s.held_ids, max_new_tokens=1)
            g, a = nat.mixer_seconds()
            gs.append(g / n_gdn * 1e3)
            as_.append(a / n_att * 1e3)
            toks.append(r.decode_ms)
        rows.append((ctx, float(np.median(gs)), float(np.median(as_)), float(np.median(toks))))
    print(f"\nper-token decode cost per layer (ms), {n_gdn} GDN + {n_att} attention layers")
    print(f"{'context':>8} {'GDN/layer':>10} {'attn/layer':>11} {'token':>8}  (medians, ms)")
    for ctx, g, a, tok in rows:
        print(f"{ctx:>8} {g:>10.3f} {a:>11.3f} {tok:>8.1f}")
    (c0, g0, a0, _), (c1, g1, a1, _) = rows[0], rows[-1]
    print(f"context x{c1 / c0:.1f}: GDN cost x{g1 / g0:.2f} (flat), attention cost x{a1 / a0:.2f} (grows)")

    # snapshot cost: an every-N policy over a prompt
    s = eng.session(CheckpointPolicy(every=64))
    r = s.generate(ids[:512])
    n = len(s.checkpoints)
    mib = s.snapshot_bytes / n / 2**20
    dec = rows[0][3]
    print(f"\nsnapshots: {n} taken, {mib:.2f} MiB each ({s.snapshot_bytes / 2**20:.1f} MiB total), "
          f"{r.snapshot_ms / r.snapshots_taken:.2f} ms each = {r.snapshot_ms / r.snapshots_taken / dec:.3f}x "
          f"one decode token")
    s_80b = 36 * (32 * 128 * 128 + (2 * 16 * 128 + 32 * 128) * 3) * 4 / 2**20
    print(f"same formula at Qwen3-Next-80B-A3B (36 GDN layers, fp32 S): {s_80b:.1f} MiB per snapshot "
          f"(x{s_80b / mib:.1f} this preset)")
    pre = prefill_tok / prefill_s
    print(f"\nprefill: {pre:.1f} tok/s over {prefill_tok} tokens; decode at ctx {rows[0][0]}: "
          f"{1e3 / rows[0][3]:.2f} tok/s; prefill/decode throughput x{pre * rows[0][3] / 1e3:.1f}")
    print(f"re-reading a 1000-token reply costs ~{1000 / pre:.1f}s of prefill vs {mib:.2f} MiB for one more "
          f"checkpoint")


if __name__ == "__main__":
    main()
