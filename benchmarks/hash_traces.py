"""Replay speed on a production-sized hash trace: the vLLM cache model vs a plain-Python LRU over the same hash
ids, in the same run; and how close their hit rates are (the issue's done-when: unbounded within 1 pp, 3 M and
50 M tokens within 2 pp).

    PYTHONPATH=$PWD python benchmarks/hash_traces.py                    # generated: 12,000 requests, ~145 M tokens
    PYTHONPATH=$PWD python benchmarks/hash_traces.py --trace conversation_trace.jsonl   # a real Mooncake file

The peer is the simplest correct thing: an `OrderedDict` LRU of 512-token blocks (a request's blocks touched
tail first, so a prefix outlives its tail), hit = leading cached blocks x 512 capped at input_length. The
vLLM model runs its own rules (16-token blocks, hit <= prompt_len - 1, outputs cached, reverse-order free
queue). Seconds are wall time of the replay alone (trace loading is timed apart), fastest of --repeat runs.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import OrderedDict


def lru_hit_rate(trace, capacity_tokens: int | None) -> float:
    """Token hit rate of an LRU over the trace's hash ids (the independent reference)."""
    T = trace.block
    cap = None if capacity_tokens is None else capacity_tokens // T
    cache: OrderedDict = OrderedDict()
    hit = 0
    for r in trace.records:
        hs = r["hash_ids"]
        k = 0
        for h in hs:
            if h not in cache:
                break
            k += 1
        hit += min(k * T, r["input_length"])
        for h in reversed(hs):
            cache[h] = None
            cache.move_to_end(h)
        if cap is not None:
            while len(cache) > cap:
                cache.popitem(last=False)
    return hit / trace.prompt_tokens


def best(fn, repeat: int):
    """(result, wall seconds, CPU seconds of this process): the fastest of `repeat` runs. The replay is
    single-threaded, so on a shared machine its CPU seconds are what it would take on an idle one."""
    out, secs = None, []
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        out = fn()
        secs.append((time.perf_counter() - t, time.process_time() - c))
    return (out,) + min(secs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", help="a Mooncake/Bailian JSONL file (default: generate one)")
    ap.add_argument("--requests", type=int, default=12_000, help="requests to generate (default 12000)")
    ap.add_argument("--engine", default="vllm", help="engine spec (default vllm: 16-token blocks)")
    ap.add_argument("--capacity", action="append", type=float, default=[],
                    help="cache sizes in tokens (repeatable; default: unbounded, 3e6, 5e7)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--compare-ids", action="store_true",
                    help="also replay unbounded with id-level keys (every id hashed, no block path): same hits?")
    ap.add_argument("--out", help="append the table (markdown) to this file")
    args = ap.parse_args(argv)

    import strata_lab as sl
    from strata_lab.caches.call_ids import calls_from_hash_trace
    from strata_lab.traces.hashtrace import MooncakeShape, generate_mooncake, load_hash_trace, write_hash_trace

    path = args.trace
    if path is None:
        path = os.path.join(tempfile.mkdtemp(prefix="strata-bench-"), "mooncake.jsonl")
        write_hash_trace(generate_mooncake(MooncakeShape(requests=args.requests)), path, "mooncake")
    t = time.perf_counter()
    trace = load_hash_trace(path)
    calls = calls_from_hash_trace(trace)
    load_s = time.perf_counter() - t
    caps = [None] + [int(c) for c in args.capacity] if args.capacity else [None, 3_000_000, 50_000_000]
    lines = [f"trace: {'generated ' if args.trace is None else ''}{trace.format}, {len(trace)} requests, "
             f"{trace.prompt_tokens / 1e6:.1f} M prompt tokens; load + ids {load_s:.1f} s; "
             f"{sys.platform}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start",
             "", "| capacity (tokens) | LRU hit | engine hit | diff (pp) | LRU s (CPU s) | engine s (CPU s) | "
             "engine / LRU (CPU) |", "|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for cap in caps:
        lru, lru_s, lru_c = best(lambda: lru_hit_rate(trace, cap), args.repeat)
        spec = args.engine if cap is None else sl.parse_engine(args.engine).with_(
            **{"kv_tokens" if sl.parse_engine(args.engine).engine in ("vllm", "trtllm") else "max_total_tokens": cap})
        rep, eng_s, eng_c = best(lambda: sl.replay_engines(calls, [spec]), args.repeat)
        hit = float(rep.summary()["hit_rate"].iloc[0])
        row = (f"| {'unbounded' if cap is None else f'{cap:,}'} | {lru:.2%} | {hit:.2%} | {100 * (hit - lru):+.2f} | "
               f"{lru_s:.2f} ({lru_c:.2f}) | {eng_s:.2f} ({eng_c:.2f}) | x{eng_c / lru_c:.1f} |")
        lines.append(row)
        print(row, flush=True)
    if args.compare_ids:
        import dataclasses

        plain = [dataclasses.replace(c, blocks=None) for c in calls]
        a, a_s, a_c = best(lambda: sl.replay_engines(calls, [args.engine]), args.repeat)
        b, b_s, b_c = best(lambda: sl.replay_engines(plain, [args.engine]), args.repeat)
        same = a.frame()["reused"].tolist() == b.frame()["reused"].tolist()
        row = (f"\nunbounded, block keys vs id-level keys: {a_s:.2f} s ({a_c:.2f} CPU s) vs {b_s:.2f} s "
               f"({b_c:.2f} CPU s), x{b_c / a_c:.1f} less CPU; per-call reused identical: {same}")
        lines.append(row)
        print(row, flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n".join(lines) + "\n\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
