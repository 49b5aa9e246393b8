"""Hybrid (Qwen3-Next) engine costs through the Engine API: GDN vs attention decode cost against context,
snapshot time and size, prefill throughput.

    PYTHONPATH=$PWD python benchmarks/hybrid.py [--contexts 128 512 1536] [--decode 16] [--threads N]
        [--only-peers | --skip-peers] [--peer-prefill 256] [--peer-decode 16] [--skip-peer hf,llama-f16,llama-q8]

1. Per-token decode cost against context for two variants of the same shape that differ only in their
   mixers: every layer Gated DeltaNet vs every layer gated attention (small vocab, dense MLP, so the
   mixer dominates). The GDN state is fixed-size, so its cost stays flat; attention reads a KV cache
   that grows with the context.
2. Time and MiB per recurrent-state snapshot on the "bench" preset (a scaled Qwen3-Next-80B-A3B:
   6 GDN + 2 attention layers, MoE 16 experts top-4 + shared expert, real Qwen vocab, bf16), measured as
   the decode slowdown of a snapshot-every-token policy over no snapshots.
3. Prefill tokens/s of the bench preset, against its own decode tokens/s.
3b. GDN chunked prefill, matrix form vs the older row form (kernel option "gdn_matrix"; the process can
   also start on the row form with STRATA_GDN_SCALAR=1), interleaved in one process: prefill of
   --ab-tokens tokens on the bench preset, and on its GDN-only variant from section 1 (D=256, small vocab:
   the mixer dominates); medians of --ab-reps rounds, printed as row/matrix time ratios. Then the delta
   rule alone (one head, the bench preset's dk = dv = 64, --ab-tokens tokens, one thread) in matrix form,
   row form and token by token (the recurrent decode step).
4. Peers on the bench preset, same weights, same threads, each in its own interpreter (benchmarks/peers.py):
   transformers' Qwen3-Next on CPU (its torch fallback for the Gated DeltaNet kernels; --hf-dtype float32
   by default) and llama.cpp on qwen3next GGUFs of the same weights, f16 and Q8_0 (written by
   strata_lab.tiny.gguf_export, whose logits tests/test_gguf_export.py checks against the engine's), for
   prefill of --peer-prefill tokens and decode of --peer-decode tokens, best of --peer-rounds interleaved
   rounds (the shared cores' noise only slows a run down), printed as strata/peer ratios. The peers' OpenMP
   runs with its default wait policy (threads spin at barriers) unless --peer-omp-passive gives them strata's
   OMP_WAIT_POLICY=passive: on shared, loaded cores spinning peers slow down several-fold, so a run under
   load compares wait policies as much as engines (see benchmarks/peers.py).
   (--skip-peers to omit the section, --skip-peer hf,llama-f16,llama-q8 to omit one peer). llama.cpp needs
   llama-cpp-python, not a project dependency (CMAKE_ARGS="-DGGML_NATIVE=OFF" pip install
   llama-cpp-python); without it the section prints a note in its place.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np

from peers import in_subprocess, write_ggufs  # records the user's environment before strata_lab.engine loads


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
    from strata_lab.engine import Engine
    from strata_lab.rules import CheckpointPolicy

    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", type=int, nargs="+", default=[256, 1024, 3072])
    ap.add_argument("--decode", type=int, default=24, help="decode steps timed per point (median)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--peer-prefill", type=int, default=256)
    ap.add_argument("--peer-decode", type=int, default=16)
    ap.add_argument("--peer-rounds", type=int, default=2, help="section 4: interleaved rounds, best of each kept")
    ap.add_argument("--hf-dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--skip-peers", action="store_true")
    ap.add_argument("--peer-omp-passive", action="store_true",
                    help="section 4: the peers' OpenMP threads sleep at barriers, as strata's do")
    ap.add_argument("--skip-peer", default="", help="comma list of section-4 peers to omit: hf, llama-f16, llama-q8")
    ap.add_argument("--only-peers", action="store_true", help="section 4 only")
    ap.add_argument("--ab-tokens", type=int, default=512)
    ap.add_argument("--ab-reps", type=int, default=5)
    ap.add_argument("--only-ab", action="store_true", help="section 3b only")
    args = ap.parse_args(argv)
    if args.only_peers:
        peers(args)
        return
    if args.only_ab:
        gdn_ab(args)
        return
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
    gdn_ab(args)
    if not args.skip_peers:
        peers(args)


def gdn_ab(args) -> None:
    """Section 3b: GDN chunked prefill, matrix form vs row form, same weights, same process, interleaved."""
    from strata_lab import _native
    from strata_lab.tiny import NEXT_PRESETS, make_tiny
    from strata_lab.engine import Engine
    from strata_lab.rules import CheckpointPolicy

    _engine = _native.engine()
    tmp = tempfile.TemporaryDirectory()
    common = dict(vocab_size=4096, num_hidden_layers=2, num_experts=0, hidden_size=256, intermediate_size=512,
                  tie_word_embeddings=True, full_attention_interval=3)
    models = {"bench preset (6 GDN + 2 attention, MoE)": (make_tiny(f"{tmp.name}/bench", "qwen3_next", "bench",
                                                                    dtype="bfloat16"), 151643),
              "GDN-only (2 GDN layers, D=256)": (make_tiny(f"{tmp.name}/gdn", "qwen3_next", "bench",
                                                           dtype="bfloat16", overrides=common), 4096)}
    print(f"\nGDN chunked prefill A/B, {args.ab_tokens} tokens, medians of {args.ab_reps} interleaved rounds:")
    print("| model | matrix form ms | row form ms | row/matrix |\n|---|---:|---:|---:|")
    try:
        for name, (path, hi) in models.items():
            eng = Engine.load(path, threads=args.threads)
            ids = [int(i) for i in np.random.default_rng(3).integers(0, hi, args.ab_tokens)]
            s = eng.session("ab", checkpoints=CheckpointPolicy(at_prompt_end=False))
            times: dict[bool, list[float]] = {True: [], False: []}
            for rep in range(args.ab_reps + 1):  # round 0 warms up
                for on in (True, False):
                    _engine._set_kernel_option("gdn_matrix", on)
                    s.reset()
                    ms = s.generate(ids, max_new_tokens=0).result.prefill_ms
                    if rep:
                        times[on].append(ms)
            new, old = statistics.median(times[True]), statistics.median(times[False])
            print(f"| {name} | {new:.1f} | {old:.1f} | x{old / new:.2f} |")
    finally:
        _engine._set_kernel_option("gdn_matrix", True)
        tmp.cleanup()
    b = NEXT_PRESETS["bench"]
    dk, dv, T = b.linear_key_head_dim, b.linear_value_head_dim, args.ab_tokens
    rng = np.random.default_rng(4)
    q, k = rng.standard_normal((T, dk), np.float32), rng.standard_normal((T, dk), np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True) * np.sqrt(dk)
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    v = rng.standard_normal((T, dv), np.float32)
    beta = np.full(T, 0.5, np.float32)
    g = (-0.1 * np.abs(rng.standard_normal(T))).astype(np.float32)
    S0 = np.zeros((dk, dv), np.float32)
    reps = max(20, 4 * args.ab_reps)
    t: dict[str, list[float]] = {"matrix": [], "rows": [], "recurrent": []}
    for _ in range(reps + 1):
        for mode in t:
            t0 = time.perf_counter()
            _engine._gdn_delta(q, k, v, beta, g, S0, mode=mode)
            t[mode].append(time.perf_counter() - t0)
    med = {m: statistics.median(x[1:]) * 1e3 for m, x in t.items()}
    print(f"delta rule alone, one head, dk=dv={dk}, {T} tokens, medians of {reps}: matrix {med['matrix']:.3f} ms, "
          f"rows {med['rows']:.3f} ms, token by token {med['recurrent']:.3f} ms: rows/matrix "
          f"x{med['rows'] / med['matrix']:.2f}, token-by-token/matrix x{med['recurrent'] / med['matrix']:.2f}")


def peers(args) -> None:
    """Section 4: strata vs transformers' Qwen3-Next (CPU torch fallback) and llama.cpp (a qwen3next GGUF
    of the same weights) on the bench preset, each peer in its own interpreter (benchmarks/peers.py)."""
    from strata_lab.tiny import make_tiny
    from strata_lab.engine import Engine
    from strata_lab.rules import CheckpointPolicy

    tmp = tempfile.TemporaryDirectory()
    path = make_tiny(f"{tmp.name}/bench", "qwen3_next", "bench", dtype="bfloat16")
    prompt = [int(i) for i in np.random.default_rng(2).integers(0, 151643, args.peer_prefill)]
    threads = args.threads or 2
    skip = set(filter(None, args.skip_peer.split(",")))
    qtypes = [q for q in ("f16", "q8_0") if f"llama-{q.removesuffix('_0')}" not in skip]
    notes = []
    if qtypes and not write_ggufs(path, qtypes):
        notes.append("llama.cpp: not run (llama-cpp-python is not installed: "
                     "CMAKE_ARGS=\"-DGGML_NATIVE=OFF\" pip install llama-cpp-python)")
        qtypes = []
    eng = Engine.load(path, threads=threads)
    s = eng.session("peer", checkpoints=CheckpointPolicy(at_prompt_end=False))
    s.generate(prompt[:8], max_new_tokens=1)  # warm up

    def strata():
        s.reset()
        r = s.generate(prompt, max_new_tokens=args.peer_decode).result
        return len(prompt) / (r.prefill_ms / 1e3), args.peer_decode / (r.decode_ms / 1e3)

    systems = {"strata bf16": strata}
    if "hf" not in skip:
        systems[f"transformers {args.hf_dtype} (torch fallback)"] = lambda: in_subprocess(
            "hf", path, prompt, args.peer_decode, threads, args.hf_dtype, args.peer_omp_passive)
    for q in qtypes:
        systems[f"llama.cpp {q.upper()} GGUF"] = lambda q=q: in_subprocess(
            "llama", path, prompt, args.peer_decode, threads, q, args.peer_omp_passive)
    # rounds interleave the systems; each keeps its best prefill and best decode (the shared cores' noise
    # only ever slows a run down)
    best: dict[str, tuple[float, float]] = {}
    for _ in range(args.peer_rounds):
        for name, run in list(systems.items()):
            try:
                p, d = run()
            except ImportError as e:  # transformers or llama-cpp-python missing in the peer's interpreter
                notes.append(f"{name}: not run ({e})")
                del systems[name]
                continue
            p0, d0 = best.get(name, (0.0, 0.0))
            best[name] = (max(p, p0), max(d, d0))
    ours = best["strata bf16"]

    print(f"\npeers, bench preset (bf16 weights), prefill {len(prompt)}, decode {args.peer_decode}, {threads} threads, "
          f"best of {args.peer_rounds} interleaved rounds, peers' OMP_WAIT_POLICY "
          f"{'passive' if args.peer_omp_passive else 'their default'}:")
    print("| system | prefill tok/s | decode tok/s | strata/system prefill | strata/system decode |")
    print("|---|---:|---:|---:|---:|")
    for name, (p, d) in best.items():
        if name == "strata bf16":
            print(f"| {name} | {p:.1f} | {d:.2f} | | |")
            continue
        print(f"| {name} | {p:.1f} | {d:.2f} | x{ours[0] / p:.2f} | x{ours[1] / d:.2f} |")
    for n in notes:
        print(n)
    tmp.cleanup()


if __name__ == "__main__":
    main()
