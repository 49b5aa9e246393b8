"""Engine cache models: calls/s per core on an agent-like trace with ~20k-token prompts.

    PYTHONPATH=$PWD python benchmarks/caches.py [--sessions 8 --turns 100 --repeats 3]

The trace: `--sessions` agent sessions interleaved in time, each starting from a 14k-token context (a shared
2k-token system prompt + its own history) and growing by a tool result (~120 ids) and a reply (~60 ids) per
turn, so prompts average ~20k ids. Calls are built once (numpy ids); what is timed is the replay's per-call
work: the session view (one LCP against what the session's last call left) plus each model's plan + admit.

The floor is a plain LCP pass over the same calls (the session view alone). Printed: calls/s for the floor
and for vLLM and SGLang (unbounded, and under a budget that evicts), and each one's time as a ratio of the
floor's. Single process, single thread: calls/s is per core. Fastest of `--repeats` runs.
"""
from __future__ import annotations

import argparse
import random
import time

import numpy as np


def make_calls(sessions: int, turns: int, seed: int = 0):
    from strata_lab.caches.call_ids import Call, as_ids

    rng = np.random.default_rng(seed)
    system = rng.integers(0, 151643, 2000).tolist()
    hist = {s: system + rng.integers(0, 151643, 12000).tolist() for s in range(sessions)}
    calls = []
    pyrng = random.Random(seed)
    for t in range(turns):
        for s in range(sessions):
            prompt = hist[s] + rng.integers(0, 151643, pyrng.randrange(60, 180)).tolist()
            out = rng.integers(0, 151643, pyrng.randrange(30, 90)).tolist()
            c = Call(len(calls), f"s{s}", as_ids(prompt), as_ids(out), ts=float(len(calls)))
            calls.append(c)
            hist[s] = prompt + out
    return calls


def lcp_pass(calls):
    from strata_lab.caches.replay import _order, explain_calls

    return explain_calls(calls, None, _order(calls))


def run_engine(calls, spec):
    from strata_lab.caches.presets import parse_engine
    from strata_lab.caches.replay import _order, explain_calls

    order = _order(calls)
    hints = explain_calls(calls, None, order)
    m = parse_engine(spec).build()
    reused = 0
    for i in order:
        reused += m.step(calls[i], hints[i][0]).reused
    return reused


def best(fn, repeats):
    t = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        t.append(time.perf_counter() - t0)
    return min(t), out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--turns", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    calls = make_calls(args.sessions, args.turns)
    n = len(calls)
    mean = sum(c.prompt_len for c in calls) / n
    new = sum(c.prompt_len for c in calls[args.sessions:]) / n
    print(f"trace: {n} calls, {args.sessions} sessions, mean prompt {mean:,.0f} ids")
    floor, _ = best(lambda: lcp_pass(calls), args.repeats)
    live = args.sessions * max(c.prompt_len + len(c.output) for c in calls)
    rows = [("plain LCP pass (floor)", floor, None)]
    for spec in ("vllm", f"vllm:kv_tokens={live // 2}", "sglang", f"sglang:max_total_tokens={live // 2}"):
        t, reused = best(lambda: run_engine(calls, spec), args.repeats)
        rows.append((spec, t, reused))
    print(f"{'':40s} {'calls/s':>10s} {'x floor time':>13s} {'hit rate':>9s}")
    total = sum(c.prompt_len for c in calls)
    for name, t, reused in rows:
        hr = f"{reused / total:.1%}" if reused is not None else ""
        print(f"{name:40s} {n / t:10,.0f} {t / floor:13.2f} {hr:>9s}")
    del new


if __name__ == "__main__":
    main()
