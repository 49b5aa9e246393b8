"""Ingest and replay speed: strata_lab.load_dump (orjson, streaming) vs plain json.loads per line.

    PYTHONPATH=$PWD python benchmarks/replay.py [--mb 64]

Writes a synthetic agent-like dump (sessions whose prompts grow turn by turn) to a temp dir, then
prints MB/s for both readers and their ratio, and the replay rate in calls/s.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time


def make_dump(path: str, target_mb: float) -> int:
    from strata_lab.dump.writer import Recorder

    rng = random.Random(0)
    calls = 0
    with Recorder(path) as rec:
        s = 0
        while os.path.getsize(path) < target_mb * 2**20:
            held: list[int] = []
            for call in range(12):
                prompt = held + [rng.randrange(151643) for _ in range(rng.randrange(50, 400))]
                gen = [rng.randrange(151643) for _ in range(rng.randrange(20, 300))]
                rec.write_call(session=f"s{s}", call=0, prompt_ids=prompt, reused=len(held), gen_ids=gen,
                               prefill_ms=0.05 * (len(prompt) - len(held)), decode_ms=10.0 * len(gen))
                held = prompt + gen
                calls += 1
            s += 1
    return calls


def best_of(fn, n=3) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=64.0)
    ap.add_argument("--replay-calls", type=int, default=300)
    args = ap.parse_args()
    from strata_lab.dump.reader import load_dump

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "bench.jsonl")
        calls = make_dump(path, args.mb)
        mb = os.path.getsize(path) / 2**20

        def ours():
            n = sum(1 for _ in load_dump(path))
            assert n == calls

        def plain():
            n = 0
            with open(path, "rb") as f:
                for line in f:
                    json.loads(line)
                    n += 1
            assert n == calls

        t_ours, t_plain = best_of(ours), best_of(plain)
        print(f"dump: {mb:.1f} MB, {calls} calls")
        print(f"load_dump (orjson): {mb / t_ours:7.1f} MB/s")
        print(f"json.loads        : {mb / t_plain:7.1f} MB/s")
        print(f"ratio             : {t_plain / t_ours:.2f}x faster than json.loads")

        from strata_lab.replayer import replay
        small = os.path.join(tmp, "small.jsonl")
        with open(path, "rb") as src, open(small, "wb") as dst:
            for i, line in enumerate(src):
                if i >= args.replay_calls:
                    break
                dst.write(line)
        t0 = time.perf_counter()
        rep = replay(small)
        dt = time.perf_counter() - t0
        print(f"replay            : {rep['calls'] / dt:7.1f} calls/s ({rep['prompt_tokens'] / dt / 1e6:.2f} M prompt ids/s)")


if __name__ == "__main__":
    main()
