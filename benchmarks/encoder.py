"""Benchmark: PromptEncoder vs tokenizer.encode of every full prompt over an agent-like session.

The session grows to ~200K tokens over ~50 turns (system + tools, then assistant replies with tool calls
and tool outputs: source code, logs, prose in several languages). Both sides produce ids for every prompt;
the ids must be identical. The machine may be shared and noisy, so the two methods are interleaved turn by
turn (both see the same load), the whole session is replayed `--repeats` times with a fresh encoder, and
each turn counts with its fastest time (time.perf_counter). Prints total times, the ratio, and peak traced
Python memory (tracemalloc, measured in a separate pass).

    PYTHONPATH=. python benchmarks/encoder.py [--turns 50] [--target-tokens 200000] [--repeats 3]
"""
from __future__ import annotations

import argparse
import random
import sys
import time
import tracemalloc
from pathlib import Path

from tqdm import tqdm

from strata_lab import load_tokenizer
from strata_lab.text.encoder import PromptEncoder

ROOT = Path(__file__).resolve().parents[1]
PROSE = ("Öğrenci sınavı geçti ve çok mutlu oldu. ", "这个函数返回一个列表。", "Die Straße ist lang. ",
         "The build failed with exit code 2; retrying with verbose logs.\n", "  at line 42:\t🙂 ok\n")


def corpus() -> list[str]:
    files = sorted(p for p in ROOT.rglob("*") if p.suffix in {".py", ".md", ".cpp", ".h", ".toml"}
                   and "build" not in p.parts and ".git" not in p.parts)
    return [p.read_text(encoding="utf-8", errors="replace") for p in files if p.stat().st_size < 200_000]


def session(turns: int, target_tokens: int, seed: int = 0) -> list[str]:
    """Prompts of one agent session: each is the previous prompt plus a reply and a tool result."""
    rng = random.Random(seed)
    docs = corpus()
    per_turn_chars = int(target_tokens * 3.6 / turns)  # ~3.6 chars a token for this mix
    prompt = "<|im_start|>system\nYou are a coding agent. Tools: read_file, run, search.<|im_end|>\n"
    prompt += "<|im_start|>user\nFix the failing build and explain.<|im_end|>\n"
    prompts = []
    for turn in range(turns):
        prompts.append(prompt + "<|im_start|>assistant\n")
        chunk = []
        while sum(map(len, chunk)) < per_turn_chars:
            doc = rng.choice(docs)
            start = rng.randrange(max(1, len(doc) - 4000))
            chunk.append(doc[start:start + rng.randint(500, 4000)])
            chunk.append(rng.choice(PROSE) + f" step {turn}.{len(chunk)} took {rng.random():.4f}s\n")
        reply = f"<think>\nTurn {turn}: look at the output.\n</think>\n\nRunning the next step.\n"
        reply += f'<tool_call>\n{{"name": "run", "arguments": {{"cmd": "pytest -q -k t{turn}"}}}}\n</tool_call>'
        prompt += "<|im_start|>assistant\n" + reply + "<|im_end|>\n"
        prompt += "<|im_start|>user\n<tool_response>\n" + "".join(chunk) + "\n</tool_response><|im_end|>\n"
    return prompts


def timed(fn, arg):
    t0 = time.perf_counter()
    out = fn(arg)
    return time.perf_counter() - t0, out


def measure(prompts: list[str], tokenizer, repeats: int, chunk_chars: int = 4096):
    """Per-turn fastest times of (full encode, incremental encode, tokenizer on the new text alone) over
    `repeats` interleaved replays, and whether the ids were identical."""
    best_full = [float("inf")] * len(prompts)
    best_inc = [float("inf")] * len(prompts)
    best_new = [float("inf")] * len(prompts)
    same = True
    for r in range(repeats):
        enc = PromptEncoder(tokenizer, chunk_chars=chunk_chars)
        for k, p in enumerate(tqdm(prompts, desc=f"replay {r + 1}/{repeats}", leave=False)):
            new_text = p[len(prompts[k - 1]) if k else 0:]  # each prompt extends the previous one
            best_new[k] = min(best_new[k], timed(tokenizer.encode, new_text)[0])
            # alternate which method goes first, so neither always runs right after the other
            if k % 2:
                t_inc, ids_inc = timed(enc.encode, p)
                t_full, ids_full = timed(tokenizer.encode, p)
            else:
                t_full, ids_full = timed(tokenizer.encode, p)
                t_inc, ids_inc = timed(enc.encode, p)
            same = same and ids_inc == ids_full
            best_full[k] = min(best_full[k], t_full)
            best_inc[k] = min(best_inc[k], t_inc)
    return best_full, best_inc, best_new, same


def peak_mib(prompts, tokenizer, incremental: bool) -> float:
    tracemalloc.start()
    try:
        enc = PromptEncoder(tokenizer)
        for p in prompts:
            enc.encode(p) if incremental else tokenizer.encode(p)
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=50)
    ap.add_argument("--target-tokens", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--chunk-chars", type=int, default=4096,
                    help="PromptEncoder chunk_chars: new text of >= 2x this is encoded in parallel chunks")
    args = ap.parse_args(argv)
    if args.turns < 1 or args.target_tokens < 1 or args.repeats < 1:
        raise ValueError("--turns, --target-tokens and --repeats must be positive")
    tok = load_tokenizer("qwen3")
    prompts = session(args.turns, args.target_tokens)
    tok.encode("warm up")
    PromptEncoder(tok).encode("warm up")  # per-tokenizer tables, class table
    best_full, best_inc, best_new, same = measure(prompts, tok, args.repeats, args.chunk_chars)
    t_full, t_inc, t_new = sum(best_full), sum(best_inc), sum(best_new)
    n_tokens = len(tok.encode(prompts[-1]))
    print(f"session: {len(prompts)} turns, last prompt {len(prompts[-1]):,} chars / {n_tokens:,} tokens, "
          f"{sum(map(len, prompts)):,} chars encoded in total by tokenizer.encode")
    print(f"PromptEncoder chunk_chars={args.chunk_chars}")
    print(f"timing: per-turn fastest of {args.repeats} interleaved replays (time.perf_counter)")
    print(f"tokenizer.encode (full every turn): {t_full:8.3f} s")
    print(f"PromptEncoder (incremental):        {t_inc:8.3f} s")
    print(f"ratio: {t_full / t_inc:.1f}x faster, identical ids: {same}")
    print(f"floor: tokenizer.encode of only the new text of each turn {t_new:.3f} s ({t_full / t_new:.1f}x); "
          f"PromptEncoder overhead over it {100 * (t_inc / t_new - 1):+.0f}%")
    print(f"peak traced memory: full {peak_mib(prompts, tok, False):.1f} MiB, "
          f"incremental {peak_mib(prompts, tok, True):.1f} MiB")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
