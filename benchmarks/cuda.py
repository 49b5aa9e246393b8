"""The CUDA backend against transformers (SDPA, bf16) on the same GPU, on a random-weight Qwen3-0.6B-shape
model (docs/ENGINE.md "GPU"). Run by scripts/device_check.sh on a lent GPU machine; writes one Markdown table.

Measured, each the median of `--reps` runs after a warm-up:
- prefill of 512 and 4,096 tokens, one sequence (strata: a fresh session's prompt read, in its 512-token
  chunks; transformers: one forward with logits of the last position only);
- decode at 1,024 and 16,384 tokens of context, 1 stream and 8 concurrent streams (strata: 8 sessions
  generating on 8 threads, batched by the engine's step thread; transformers: a batch of 8 rows), greedy,
  `--decode` steps; ms per step and tokens/s;
- decode's achieved memory bandwidth: (the bf16 weights a step reads + the KV cache it reads) / step time,
  as a fraction of the GPU's nominal bandwidth (a table of known parts; else of a measured device copy).

    python benchmarks/cuda.py --out $OUT/cuda.md
"""
from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

# nominal HBM bandwidth (bytes/s) by device name fragment
NOMINAL_BW = {"H200": 4.8e12, "H100 80GB HBM3": 3.35e12, "H100 PCIe": 2.0e12, "H100": 3.35e12, "A100-SXM4-80GB": 2.04e12,
              "A100": 1.55e12}


def gpu_bandwidth() -> tuple[str, float, str]:
    """(device name, bytes/s, where the figure comes from)."""
    import torch

    name = torch.cuda.get_device_name(0)
    for key, bw in NOMINAL_BW.items():
        if key in name:
            return name, bw, "nominal"
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")  # else: a 1 GiB device copy, read + write
    y = torch.empty_like(x)
    y.copy_(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    torch.cuda.synchronize()
    return name, 2 * 10 * x.numel() / (time.perf_counter() - t0), "measured copy"


def kv_bytes_per_step(cfg: dict, context: int, streams: int) -> int:
    # K and V, bf16, every layer and kv head, every held position
    return streams * context * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * 2 * 2


def median(xs):
    return statistics.median(xs)


# ------------------------------------------------------------------ strata

def strata_prefill_ms(engine, prompt, reps: int) -> float:
    times = []
    for r in range(reps + 1):
        name = f"prefill{r}"
        res = engine.session(name).generate(prompt, max_new_tokens=0)
        times.append(res.result.prefill_ms)
        engine._e.drop_session(name)
        engine._sessions.pop(name, None)
    return median(times[1:])


def strata_decode_ms(engine, prompts, steps: int, reps: int) -> float:
    """ms per decode step of len(prompts) sessions decoding together (each prompt read first)."""
    names = [f"decode{i}" for i in range(len(prompts))]
    for name, p in zip(names, prompts):
        engine.session(name).generate(p, max_new_tokens=0).ids()
    times = []
    for _ in range(reps + 1):
        barrier = threading.Barrier(len(prompts) + 1)

        def run(name, p):
            barrier.wait()
            # the prompt again: the held ids minus the last generated ones; reads one id, then decodes
            engine.session(name).generate(p, max_new_tokens=steps, force_ids=[7] * steps).ids()

        threads = [threading.Thread(target=run, args=(n, p)) for n, p in zip(names, prompts)]
        for t in threads:
            t.start()
        barrier.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        times.append((time.perf_counter() - t0) * 1e3 / steps)
    for name in names:
        engine._e.drop_session(name)
        engine._sessions.pop(name, None)
    return median(times[1:])


# ------------------------------------------------------------------ transformers

def hf_prefill_ms(model, prompt, reps: int) -> float:
    import torch

    x = torch.tensor([prompt], device="cuda")
    times = []
    with torch.inference_mode():
        for _ in range(reps + 1):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model(x, logits_to_keep=1)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
    return median(times[1:])


def hf_decode_ms(model, prompts, steps: int, reps: int) -> float:
    import torch

    x = torch.tensor(prompts, device="cuda")
    times = []
    with torch.inference_mode():
        for _ in range(reps + 1):
            out = model(x, use_cache=True, logits_to_keep=1)
            cache, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(steps):
                out = model(nxt, past_key_values=cache, use_cache=True)
                cache, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3 / steps)
            del out, cache
    return median(times[1:])


# ------------------------------------------------------------------ main

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the Markdown file to write")
    ap.add_argument("--model", help="a Qwen3 folder (default: a random qwen3-0.6b-shape one, bf16)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--decode", type=int, default=32, help="decode steps per measurement")
    ap.add_argument("--prefill", default="512,4096")
    ap.add_argument("--context", default="1024,16384")
    ap.add_argument("--streams", default="1,8")
    args = ap.parse_args(argv)
    for name in ("reps", "decode"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name} must be >= 1")
    prefills = [int(v) for v in args.prefill.split(",")]
    contexts = [int(v) for v in args.context.split(",")]
    streams = [int(v) for v in args.streams.split(",")]

    import json

    import torch
    import transformers

    from strata_lab.engine import Engine
    from strata_lab.tiny import make_tiny

    tmp = tempfile.TemporaryDirectory()
    path = Path(args.model) if args.model else make_tiny(Path(tmp.name) / "m", preset="qwen3-0.6b", dtype="bfloat16")
    cfg = json.loads((path / "config.json").read_text())
    rng = np.random.default_rng(0)
    longest = max(prefills + contexts)
    base = [int(i) for i in rng.integers(0, 150_000, size=longest + 1)]
    device, bw, bw_src = gpu_bandwidth()
    rows = []  # (what, strata, transformers, unit-less note)

    engine = Engine.load(path, device="cuda", max_context=longest + args.decode + 64)
    weight_bytes = engine.info["stream_bytes"]
    s_prefill = {n: strata_prefill_ms(engine, base[:n], args.reps) for n in prefills}
    s_decode = {}
    for c in contexts:
        for b in streams:
            prompts = [[(i + j) % 150_000 for i in base[:c]] for j in range(b)]  # distinct sequences
            s_decode[c, b] = strata_decode_ms(engine, prompts, args.decode, args.reps)
    del engine
    gc.collect()

    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, attn_implementation="sdpa").to("cuda")
    h_prefill = {n: hf_prefill_ms(hf, base[:n], args.reps) for n in prefills}
    h_decode = {}
    for c in contexts:
        for b in streams:
            prompts = [[(i + j) % 150_000 for i in base[:c]] for j in range(b)]
            h_decode[c, b] = hf_decode_ms(hf, prompts, args.decode, args.reps)
    del hf
    gc.collect()

    for n in prefills:
        rows.append((f"prefill {n} tokens (ms)", s_prefill[n], h_prefill[n],
                     f"{n / s_prefill[n] * 1e3:,.0f} vs {n / h_prefill[n] * 1e3:,.0f} tok/s"))
    for (c, b), ms in s_decode.items():
        step_bytes = weight_bytes + kv_bytes_per_step(cfg, c, b)
        rows.append((f"decode at {c} context, {b} stream{'s' if b > 1 else ''} (ms/step)", ms, h_decode[c, b],
                     f"{b / ms * 1e3:,.0f} vs {b / h_decode[c, b] * 1e3:,.0f} tok/s; strata reads "
                     f"{step_bytes / 2**20:,.0f} MiB/step = {step_bytes / (ms / 1e3) / 1e12:.2f} TB/s = "
                     f"{step_bytes / (ms / 1e3) / bw:.0%} of {bw / 1e12:.2f} TB/s ({bw_src})"))

    lines = [f"# CUDA backend vs transformers (SDPA, bf16) on {device}", "",
             f"Model: {args.model or 'random qwen3-0.6b shape'} (bf16), torch {torch.__version__}, transformers "
             f"{transformers.__version__}; median of {args.reps} after a warm-up; decode {args.decode} greedy steps "
             f"(strata: forced ids, sampled on the host). Written by `benchmarks/cuda.py` "
             f"(`scripts/device_check.sh`).", "",
             "| what | strata (cuda) | transformers | note |", "|---|---:|---:|---|"]
    lines += [f"| {what} | {s:.2f} | {h:.2f} | {note} |" for what, s, h, note in rows]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
