"""Prefill/decode speed of strata_lab's engine vs transformers (eager, bf16 and f32) and, when installed,
llama.cpp (llama-cpp-python + gguf), on one random Qwen3-0.6B-shaped checkpoint with bf16 weights.

    PYTHONPATH=$PWD python benchmarks/engine.py [--prefill 512] [--decode 128] [--threads 2] [--skip hf,llama]

Prints tokens/s per system and ratios against strata. The checkpoint is cached under build/bench/.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def checkpoint(preset: str) -> Path:
    from strata_lab.checkpoints import make_tiny

    path = ROOT / "build" / "bench" / f"{preset}-bf16"
    if not (path / "config.json").exists():
        print(f"writing {preset} bf16 checkpoint to {path} ...", flush=True)
        make_tiny(path, preset=preset, dtype="bfloat16", seed=0)
    return path


def bench_strata(path, prompt, n_decode, threads):
    from strata_lab.engine import Engine

    eng = Engine.load(path, threads=threads)
    s = eng.session("bench")
    s.generate(prompt[:16], max_new_tokens=2).result  # warm up (page in weights)
    s.reset()
    r = s.generate(prompt, max_new_tokens=n_decode).result
    assert len(r.gen_ids) == n_decode
    return len(prompt) / (r.prefill_ms / 1e3), n_decode / (r.decode_ms / 1e3)


def bench_hf(path, prompt, n_decode, threads, dtype_name):
    import torch
    from transformers import Qwen3ForCausalLM

    torch.set_num_threads(threads)
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[dtype_name]
    model = Qwen3ForCausalLM.from_pretrained(str(path), dtype=dtype, attn_implementation="eager").eval()
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        model(ids[:, :16])  # warm up
        t0 = time.perf_counter()
        out = model(ids, use_cache=True)
        t1 = time.perf_counter()
        cache, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        t2 = time.perf_counter()
        for _ in range(n_decode):
            out = model(nxt, past_key_values=cache, use_cache=True)
            cache, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        t3 = time.perf_counter()
    return len(prompt) / (t1 - t0), n_decode / (t3 - t2)


def bench_llama(path, prompt, n_decode, threads):
    import llama_cpp  # noqa: F401  (optional peer: llama-cpp-python + gguf)
    import gguf  # noqa: F401

    raise NotImplementedError("GGUF export of the random checkpoint is not written yet")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="qwen3-0.6b")
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip", default="", help="comma list of: hf, hf-f32, llama")
    args = ap.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    path = checkpoint(args.preset)
    prompt = np.random.default_rng(0).integers(0, 151669, args.prefill).tolist()

    rows = {}
    print(f"{args.preset} bf16 weights, prefill {args.prefill}, decode {args.decode}, {args.threads} threads", flush=True)
    runs = [("strata", lambda: bench_strata(path, prompt, args.decode, args.threads))]
    if "hf" not in skip:
        runs.append(("transformers bf16", lambda: bench_hf(path, prompt, args.decode, args.threads, "bf16")))
    if "hf" not in skip and "hf-f32" not in skip:
        runs.append(("transformers f32", lambda: bench_hf(path, prompt, args.decode, args.threads, "f32")))
    if "llama" not in skip:
        runs.append(("llama.cpp", lambda: bench_llama(path, prompt, args.decode, args.threads)))
    for name, fn in runs:
        try:
            rows[name] = fn()
        except (ImportError, NotImplementedError) as e:
            print(f"  {name:18s} skipped: {e}")
            continue
        print(f"  {name:18s} prefill {rows[name][0]:8.1f} tok/s   decode {rows[name][1]:6.2f} tok/s", flush=True)
    ours = rows["strata"]
    for name, (p, d) in rows.items():
        if name != "strata":
            print(f"  strata / {name:18s} prefill x{ours[0] / p:5.2f}   decode x{ours[1] / d:5.2f}")
    return rows


if __name__ == "__main__":
    main()
