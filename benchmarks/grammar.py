"""Grammar engines on our Qwen3 vocabulary, and what a JSON-schema constraint costs the decode loop.

    PYTHONPATH=$PWD python benchmarks/grammar.py [--decode 64] [--threads 2] [--preset qwen3-0.6b] [--skip decode]

1. Setup: building each engine's tokenizer view of the 151,669 Qwen3 ids.
2. Compile time per schema (caches off / fresh compilers) for xgrammar and llguidance.
3. Mask time per token: a random walk through each schema (each step picks an allowed id at random from
   the mask, as a random-weight model does), the time to fill the next-token bitmask, per engine.
4. Decode tok/s on the random Qwen3-0.6B-shaped bf16 model folder (benchmarks/engine.py's), free vs under a
   JSON-schema constraint (xgrammar mask called from the C++ decode loop), same prompt and seed, ratio.
Ratios are printed against the peer measured in the same run (timings on shared machines are noisy).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
from tqdm import tqdm

SCHEMAS = {
    "flat": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                              "ok": {"type": "boolean"}}, "required": ["name", "age", "ok"]},
    "nested": {"type": "object", "properties": {
        "user": {"type": "object", "properties": {"id": {"type": "integer"}, "tags": {"type": "array", "items": {
            "type": "string"}}}, "required": ["id", "tags"]},
        "items": {"type": "array", "items": {"type": "object", "properties": {
            "sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}}, "required": ["sku", "qty"]}}},
        "required": ["user", "items"]},
    "enum+number": {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                                     "x": {"type": "number"}, "y": {"type": "number"}},
                    "required": ["color", "x", "y"]},
    "tool-call": {"type": "object", "properties": {"name": {"const": "get_weather"}, "arguments": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"]}}, "required": ["name", "arguments"]},
}


def _vocab(tok, V):
    first_added = min(tok._added.values())
    return [b"" if i >= first_added else tok.token_bytes(i) for i in range(V)]


def setup_xgrammar(tok, V):
    import xgrammar as xgr

    t0 = time.perf_counter()
    info = xgr.TokenizerInfo(_vocab(tok, V), vocab_type=xgr.VocabType.RAW, vocab_size=V,
                             stop_token_ids=[tok.im_end_id, tok.eos_id])
    return info, time.perf_counter() - t0


def setup_llguidance(tok, V):
    import llguidance
    import llguidance.hf
    from transformers import PreTrainedTokenizerFast

    t0 = time.perf_counter()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok.hf, eos_token="<|im_end|>")
    lt = llguidance.hf.from_tokenizer(hf, n_vocab=V, eos_token=tok.im_end_id)
    return lt, time.perf_counter() - t0


def _set_bits(bits_u32: np.ndarray) -> np.ndarray:
    return np.flatnonzero(np.unpackbits(bits_u32.view(np.uint8), bitorder="little"))


def walk_xgrammar(info, schema, V, rng, max_steps=120):
    import torch
    import xgrammar as xgr

    t0 = time.perf_counter()
    compiled = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False).compile_json_schema(
        json.dumps(schema), any_whitespace=False, strict_mode=True)
    compile_s = time.perf_counter() - t0
    m = xgr.GrammarMatcher(compiled)
    bits = np.zeros((V + 31) // 32, dtype=np.uint32)
    view = torch.from_numpy(bits.view(np.int32)).view(1, -1)
    times = []
    for _ in range(max_steps):
        t = time.perf_counter()
        m.fill_next_token_bitmask(view)
        times.append(time.perf_counter() - t)
        allowed = _set_bits(bits)
        allowed = allowed[allowed < V]
        tid = int(rng.choice(allowed))
        m.accept_token(tid)
        if m.is_terminated():
            break
    return compile_s, times


def walk_llguidance(lt, schema, V, rng, max_steps=120):
    import llguidance
    import llguidance.numpy as lnp

    t0 = time.perf_counter()
    m = llguidance.LLMatcher(lt, llguidance.LLMatcher.grammar_from_json_schema(
        json.dumps(schema), defaults={"whitespace_flexible": False}))
    compile_s = time.perf_counter() - t0
    if m.is_error():
        raise RuntimeError(m.get_error())
    bits = lnp.allocate_token_bitmask(1, V)
    times = []
    for _ in range(max_steps):
        t = time.perf_counter()
        lnp.fill_next_token_bitmask(m, bits, 0)
        times.append(time.perf_counter() - t)
        allowed = _set_bits(bits[0].view(np.uint32))
        allowed = allowed[allowed < V]
        tid = int(rng.choice(allowed))
        m.consume_token(tid)
        if m.is_stopped() or m.is_accepting() and tid == lt.eos_token:
            break
    return compile_s, times


def bench_decode(tok, preset, n_decode, threads):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from engine import model_folder

    from strata_lab.engine import Engine, Sampling
    from strata_lab.grammar import TokenGrammar

    eng = Engine.load(model_folder(preset), threads=threads)
    g = TokenGrammar(tok, eng.vocab_size)
    # A schema the walk cannot finish in n_decode steps: every step pays for the mask.
    long = {"type": "array", "items": {"type": "string"}, "minItems": 10_000}
    prompt = tok.encode("<|im_start|>user\nlist things<|im_end|>\n<|im_start|>assistant\n")
    s = eng.session("bench")
    s.generate(prompt[:8], max_new_tokens=2).result  # warm up
    rates = {"free": [], "json-schema": []}
    for _ in tqdm(range(2), desc="decode rounds"):
        for name in rates:  # interleaved, same prompt and seed
            s.reset()
            mask = g.json_schema(long, think_prefix=False).mask() if name != "free" else None
            r = s.generate(prompt, max_new_tokens=n_decode, token_mask=mask,
                           sampling=Sampling(temperature=1.0, seed=1)).result
            rates[name].append(len(r.gen_ids) / (r.decode_ms / 1e3))
    return {k: max(v) for k, v in rates.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--preset", default="qwen3-0.6b")
    ap.add_argument("--skip", default="", help="comma list: llguidance, decode")
    args = ap.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))

    from strata_lab import load_tokenizer

    tok = load_tokenizer("qwen3")
    V = 151669
    rng = np.random.default_rng(0)
    engines = {"xgrammar": (setup_xgrammar, walk_xgrammar)}
    if "llguidance" not in skip:
        engines["llguidance"] = (setup_llguidance, walk_llguidance)
    rows = {}
    for name, (setup, walk) in engines.items():
        handle, setup_s = setup(tok, V)
        compiles, masks = [], []
        for sname, schema in tqdm(SCHEMAS.items(), desc=name):
            c, t = walk(handle, schema, V, rng)
            compiles.append(c)
            masks += t
        rows[name] = {"setup_s": setup_s, "compile_ms": 1e3 * statistics.median(compiles),
                      "compile_max_ms": 1e3 * max(compiles), "mask_us": 1e6 * statistics.median(masks),
                      "mask_p95_us": 1e6 * float(np.percentile(masks, 95)), "steps": len(masks)}
    print(f"\ngrammar engines on the Qwen3 vocabulary ({V} ids), {len(SCHEMAS)} schemas, random walks")
    print(f"{'engine':12s} {'setup s':>8s} {'compile ms (median/max)':>24s} {'mask us (median/p95)':>22s} {'steps':>6s}")
    for name, r in rows.items():
        print(f"{name:12s} {r['setup_s']:8.2f} {r['compile_ms']:12.2f} / {r['compile_max_ms']:9.2f} "
              f"{r['mask_us']:11.1f} / {r['mask_p95_us']:8.1f} {r['steps']:6d}")
    if "llguidance" in rows:
        x, l = rows["xgrammar"], rows["llguidance"]
        print(f"ratios xgrammar/llguidance: compile {x['compile_ms'] / l['compile_ms']:.2f}x, "
              f"mask {x['mask_us'] / l['mask_us']:.2f}x (below 1: xgrammar faster)")
    if "decode" not in skip:
        rates = bench_decode(tok, args.preset, args.decode, args.threads)
        print(f"\ndecode on {args.preset} (bf16 random weights, {args.threads} threads, {args.decode} tokens, best of 2)")
        for k, v in rates.items():
            print(f"  {k:12s} {v:8.2f} tok/s")
        over = rates["free"] / rates["json-schema"] - 1
        print(f"  constrained / free: {rates['json-schema'] / rates['free']:.3f}x  (overhead {100 * over:.1f}%)")


if __name__ == "__main__":
    main()
