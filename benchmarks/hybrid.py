"""Hybrid (Qwen3-Next) engine costs through the Engine API: GDN vs attention decode cost against context,
snapshot time and size, prefill throughput.

    PYTHONPATH=$PWD python benchmarks/hybrid.py [--contexts 128 512 1536] [--decode 16] [--threads N]

1. Per-token decode cost against context for two variants of the same shape that differ only in their
   mixers: every layer Gated DeltaNet vs every layer gated attention (small vocab, dense MLP, so the
   mixer dominates). The GDN state is fixed-size, so its cost stays flat; attention reads a KV cache
   that grows with the context.
2. Time and MiB per recurrent-state snapshot on the "bench" preset (a scaled Qwen3-Next-80B-A3B:
   6 GDN + 2 attention layers, MoE 16 experts top-4 + shared expert, real Qwen vocab, bf16), measured as
   the decode slowdown of a snapshot-every-token policy over no snapshots.
3. Prefill tokens/s of the bench preset, against its own decode tokens/s.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np


def _decode_ms(session, steps: int) -> float:
    """Median ms of one decode step continuing the held ids (one step per call, timed alone)."""
    session.generate(session.held_ids, max_new_tokens=1).result  # warm-up
    out = []
    for _ in range(steps):
        r = session.generate(session.held_ids, max_new_tokens=1).result  # prompt == held: nothing re-read
        out.append(r.decode_ms)
    return statistics.median(out)


def main(argv=None) -> None:
    from strata_lab.tiny import NEXT_PRESETS, make_tiny
    from strata_lab.engine import CheckpointPolicy, Engine

    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", type=int, nargs="+", default=[256, 1024, 3072])
    ap.add_argument("--decode", type=int, default=24, help="decode steps timed per point (median)")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    tmp = tempfile.TemporaryDirectory()

    # 1. decode cost vs context, GDN-only vs attention-only: the bench preset's heads (attention 8 x 128,
    # 2 kv heads; GDN 8/16 heads of 64) on a narrow residual (D=256) with a small vocab and dense MLP, so
    # the mixers' own work is what a decode step measures.
    b = NEXT_PRESETS["bench"]
    layers = 2
    common = dict(vocab_size=4096, num_hidden_layers=layers, num_experts=0,
                  hidden_size=256, intermediate_size=512, tie_word_embeddings=True)
    variants = {"GDN": make_tiny(f"{tmp.name}/gdn", "qwen3_next", "bench", dtype="bfloat16",
                                 overrides=dict(common, full_attention_interval=layers + 1)),
                "attention": make_tiny(f"{tmp.name}/att", "qwen3_next", "bench", dtype="bfloat16",
                                       overrides=dict(common, full_attention_interval=1))}
    ids = [int(i) for i in rng.integers(0, 4096, max(args.contexts))]
    table: dict[str, list[float]] = {}
    for name, path in variants.items():
        eng = Engine.load(path, threads=args.threads, max_context=max(args.contexts) + 4 * args.decode)
        s = eng.session("decode", checkpoints=CheckpointPolicy(at_prompt_end=False))
        row = []
        for ctx in args.contexts:
            s.reset()
            s.generate(ids[:ctx], max_new_tokens=0)
            row.append(_decode_ms(s, args.decode) / layers)
        table[name] = row
    print(f"decode ms per token per layer ({layers} layers, D=256, attention {b.num_attention_heads}x{b.head_dim} "
          f"(kv {b.num_key_value_heads}), GDN {b.linear_num_value_heads}x{b.linear_value_head_dim}; "
          f"medians of {args.decode} steps)")
    print(f"{'context':>8} {'GDN':>8} {'attention':>10} {'attn/GDN':>9}")
    for i, ctx in enumerate(args.contexts):
        g, a = table["GDN"][i], table["attention"][i]
        print(f"{ctx:>8} {g:>8.3f} {a:>10.3f} {a / g:>9.2f}")
    c0, c1 = args.contexts[0], args.contexts[-1]
    print(f"context x{c1 / c0:.1f}: GDN cost x{table['GDN'][-1] / table['GDN'][0]:.2f} (flat), "
          f"attention cost x{table['attention'][-1] / table['attention'][0]:.2f} (grows)")

    # 2-3. the bench preset: snapshot cost, prefill vs decode
    t = time.perf_counter()
    path = make_tiny(f"{tmp.name}/bench", "qwen3_next", "bench", dtype="bfloat16")
    eng = Engine.load(path, threads=args.threads)
    print(f"\nbench preset built+loaded in {time.perf_counter() - t:.1f}s "
          f"({eng.info['weight_bytes'] / 2**20:.0f} MiB of bf16 weights)")
    prompt = [int(i) for i in rng.integers(0, 151643, 512)]
    s = eng.session("prefill", checkpoints=CheckpointPolicy(at_prompt_end=False))
    r = s.generate(prompt, max_new_tokens=0).result
    prefill_tps = r.tokens_read / (r.prefill_ms / 1e3)
    dec_plain = _decode_ms(s, args.decode)
    # a call whose prompt equals the held ids reads nothing: with a turn-start policy its prefill time is
    # one snapshot; without, the same call is the overhead to subtract
    def call_ms() -> float:
        s.generate(s.held_ids, max_new_tokens=0)  # warm-up
        return statistics.median(s.generate(s.held_ids, max_new_tokens=0).result.prefill_ms
                                 for _ in range(args.decode))

    s = eng.session("prefill", checkpoints=CheckpointPolicy(at_prompt_end=True))
    with_snap = call_ms()
    mib = s.snapshot_bytes / len(s.checkpoints) / 2**20
    s = eng.session("prefill", checkpoints=CheckpointPolicy(at_prompt_end=False))
    snap_ms = max(with_snap - call_ms(), 0.0)
    print(f"snapshot: {mib:.2f} MiB each, {snap_ms:.3f} ms each = x{snap_ms / dec_plain:.4f} one decode step "
          f"({dec_plain:.1f} ms)")
    gdn = NEXT_PRESETS["bench"].layer_types().count("linear_attention")
    s_80b = 36 * (32 * 128 * 128 + (2 * 16 * 128 + 32 * 128) * 3) * 4 / 2**20
    print(f"same formula at Qwen3-Next-80B-A3B (36 GDN layers vs {gdn} here): {s_80b:.1f} MiB per snapshot "
          f"(x{s_80b / mib:.1f} this preset)")
    print(f"prefill: {prefill_tps:.1f} tok/s over {r.tokens_read} tokens; decode {1e3 / dec_plain:.2f} tok/s; "
          f"prefill/decode throughput x{prefill_tps * dec_plain / 1e3:.1f}")
    print(f"re-reading a 1000-token reply costs ~{1000 / prefill_tps:.1f} s of prefill vs {mib:.2f} MiB for "
          f"one more checkpoint")
    tmp.cleanup()


if __name__ == "__main__":
    main()
