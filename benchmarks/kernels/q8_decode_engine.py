"""Decode at a long context with the q8 KV cache, the engine as a step meets it (issue 32): the --preset layer
shape with --layers layers (bf16 random weights, benchmarks/engine.py's model folder), kv_cache="q8", --threads
threads; one --context-token prefill, then --rounds decodes of --decode tokens from the same held prompt (each
re-reads one token), each with the per-op timers (STRATA_PROFILE): decode tok/s, attention's ms per token and its
share of the timed decode ops. For an A/B of two builds, run it once per build (PYTHONPATH) in alternation: the
prefill is the slow part, so each process prefills once.

    PYTHONPATH=$PWD python benchmarks/kernels/q8_decode_engine.py [--context 16384] [--layers 2] [--decode 16]
        [--rounds 3] [--label NAME]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("STRATA_PROFILE", "1")  # read before the module loads

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def add_args(ap):
    """The model, context and decode options (q8_decode_engine_ab.py takes the same)."""
    ap.add_argument("--preset", default="qwen3-0.6b")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--context", type=int, default=16384)
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)


def held_session(args):
    """(the extension, a q8 session holding the --context-token prompt and --decode generated ids, the prompt,
    the wall seconds of that first generate, its result)"""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import engine as bench  # noqa: E402  (benchmarks/engine.py: the model folder)
    from strata_lab.engine import Engine, _ext

    ext = _ext()
    path = bench.model_folder(args.preset, None if args.layers == 28 and args.preset == "qwen3-0.6b" else args.layers)
    eng = Engine.load(path, threads=args.threads, kv_cache="q8", max_context=args.context + 8 * args.decode)
    prompt = np.random.default_rng(0).integers(0, 151669, args.context).tolist()
    s = eng.session("q8")
    s.generate(prompt[:16], max_new_tokens=2).result
    s.reset()
    t0 = time.perf_counter()
    r = s.generate(prompt, max_new_tokens=args.decode).result
    return ext, s, prompt, time.perf_counter() - t0, r


def profiled_round(ext, s, prompt, decode):
    """One decode of ``decode`` tokens from the held prompt (re-reading one token) under the per-op timers:
    decode tok/s, attention ms per token, its share (%) of the timed decode ops, the rest ms per token."""
    ext._profile(True)
    r = s.generate(prompt, max_new_tokens=decode).result
    prof = ext._profile(True)
    assert r.tokens_read <= 1 and len(r.gen_ids) == decode
    d = prof["decode"]
    secs = d["seconds"]
    total = sum(secs.values())
    att = secs.get("attention", 0.0)
    n = max(1, d["tokens"])
    return {"tok_s": decode / (r.decode_ms / 1e3), "att_ms": att * 1e3 / n, "share": 100 * att / total,
            "rest_ms": (total - att) * 1e3 / n}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_args(ap)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--label", default="")
    args = ap.parse_args(argv)
    ext, s, prompt, secs, r = held_session(args)
    print(f"{args.label} level {ext.kernel_level()} prefill {args.context} tokens {secs:.1f} s "
          f"({args.context / (r.prefill_ms / 1e3):.1f} tok/s), first decode {args.decode / (r.decode_ms / 1e3):.2f} tok/s",
          flush=True)
    for rnd in range(args.rounds):
        r = profiled_round(ext, s, prompt, args.decode)
        print(f"{args.label} round {rnd + 1}: decode {r['tok_s']:.2f} tok/s, attention {r['att_ms']:.2f} ms/token = "
              f"{r['share']:.1f} % of decode, the rest {r['rest_ms']:.2f} ms/token; load {os.getloadavg()[0]:.1f}",
              flush=True)


if __name__ == "__main__":
    main()
