"""Trace storage, ingest and replay speed: JSONL vs the Parquet store, the record replay vs the delta replay,
in-process vs Dask, and peak memory. Every ratio is against a peer measured in the same run.

    PYTHONPATH=$PWD python benchmarks/replay.py [--mb 16] [--sessions 40] [--tile 8] [--no-dask]
        [--baseline-rev 8edd006 | --baseline-dir DIR | --no-baseline] [--big-gb 20]

Workloads: "random" (the synthetic agent-like dump this benchmark always used: sessions whose prompts grow
turn by turn with random ids) and "fleet" (strata_lab.fleet: agent sessions rendered with the real template
and tokenizer, tiled --tile times with renamed sessions so the trace is large without generating it all).
"old replay" is `replay(dump.jsonl)` (the call-by-call path of this checkout); "new" is `replay(store)` (the C++
replay core, strata_lab/replayer/native.py; the same report, every row equal), also timed per domain on the core
alone (the call-by-call replay of the same store is the Python reference).
"plain store read" reads every row as Python values (what a Python consumer of the store does at least); the
stricter "Arrow batches only" reads the same columns in seq order without a Python value per row; "new in CPU
time" is the replay against the plain store read in CPU time (`time.process_time`, least of 5 interleaved pairs),
steadier than wall clock on a shared machine. "baseline" is the replay of the code
when the fleet-scale issue was filed (git rev --baseline-rev, checked out and built once under
build/replay-baseline/, or an existing built checkout given with --baseline-dir), run on the same JSONL in a
child interpreter in the same run, tokenizer loaded before the clock starts: the "today's rate" the issue's
30x target is measured against. --big-gb N tiles the fleet store (renamed sessions, shifted seq) into a store
of N GB of logical JSONL and reports the in-process replay's calls/s and peak RSS on it.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

import orjson
from tqdm import tqdm


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


def make_fleet(path: str, sessions: int, tile: int, tok) -> int:
    """A generated fleet, tiled: copy k renames sessions and replicas and shifts time by k hours."""
    from strata_lab.fleet import FleetConfig, generate_fleet

    recs = list(generate_fleet(FleetConfig(sessions=sessions, replicas=4, seed=0), tokenizer=tok))
    n = 0
    with open(path, "wb") as f:
        for k in range(tile):
            for r in recs:
                r2 = dict(r, session=f"{r['session']}-k{k}", replica=f"{r['replica']}-k{k % 2}",
                          ts=r["ts"] + 3600.0 * k, request_id=f"{r['request_id']}-k{k}")
                f.write(orjson.dumps(r2) + b"\n")
                n += 1
    return n


def best_of(fn, n=3) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def best_cpu_pair(a, b, n=5) -> tuple[float, float]:
    """CPU seconds (`time.process_time`: every thread of this process) of `a` and of `b`, each the least of
    `n` runs taken in turn: on a shared, loaded machine wall-clock ratios swing, CPU time much less."""
    ta, tb = [], []
    for _ in range(n):
        for fn, out in ((a, ta), (b, tb)):
            t0 = time.process_time()
            fn()
            out.append(time.process_time() - t0)
    return min(ta), min(tb)


_HWM = ("def hwm(key='VmHWM'):\n    for line in open('/proc/self/status'):\n        if line.startswith(key):\n"
        "            return int(line.split()[1]) / 1024\n")


def peak_rss_mib(setup: str, code: str, *, with_output: bool = False):
    """(RSS after `setup`, peak RSS while `code` runs after it), in MiB, in a child Python. The peak is
    reset between the two (Linux: echo 5 > /proc/self/clear_refs), so the second is the code's own peak."""
    prog = (_HWM + setup + "\nbase = hwm('VmRSS')\nopen('/proc/self/clear_refs', 'w').write('5')\n" + code +
            "\nprint('RSS', base, hwm())")
    out = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    base, peak = out.stdout.split("RSS")[-1].split()
    if with_output:
        return float(base), float(peak), out.stdout.split("RSS")[0]
    return float(base), float(peak)


BASELINE_REV = "8edd006"  # main when the fleet-scale issue was filed (its "today's rate")

_BASELINE_PROG = """
import sys, time
import strata_lab as sl
tok = sl.load_tokenizer("qwen3")
tok.encode("warm up")
t0 = time.perf_counter()
r = sl.replay(sys.argv[1], tokenizer=tok)
dt = time.perf_counter() - t0
print("BASELINE", r["calls"], r["prompt_tokens"], dt)
"""


def baseline_checkout(args) -> str | None:
    """A built checkout of the baseline revision (made once under build/replay-baseline/), or None."""
    from pathlib import Path

    if args.no_baseline:
        return None
    if args.baseline_dir:
        return args.baseline_dir
    root = Path(__file__).resolve().parents[1]
    dest = root / "build" / "replay-baseline" / args.baseline_rev
    if not list((dest / "strata_lab").glob("_engine*.so")):
        print(f"(building the baseline {args.baseline_rev} in {dest}: once, a few minutes)", flush=True)
        try:
            if not (dest / ".git").exists():
                subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", "--force", str(dest),
                                args.baseline_rev], check=True, capture_output=True)
            subprocess.run(["bash", str(dest / "scripts" / "dev_build.sh")], check=True, capture_output=True,
                           cwd=dest)
        except (subprocess.CalledProcessError, OSError) as e:
            print(f"(no baseline: {e})")
            return None
    return str(dest)


def baseline_rate(checkout: str, path: str) -> tuple[int, int, float]:
    """(calls, prompt ids, seconds) of the baseline checkout's replay of `path`, in a child interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = checkout
    out = subprocess.run([sys.executable, "-c", _BASELINE_PROG, path], capture_output=True, text=True,
                         check=True, env=env, cwd=checkout)
    calls, ids, dt = out.stdout.split("BASELINE")[-1].split()[:3]
    return int(calls), int(ids), float(dt)


def _warm_worker() -> None:
    import pyarrow.compute  # noqa: F401
    import pyarrow.parquet  # noqa: F401

    import strata_lab.caches.report  # noqa: F401
    import strata_lab.replayer.native  # noqa: F401


def bench_workload(name, path, calls, tok, tmp, args, baseline=None) -> None:
    from strata_lab import replay
    from strata_lab.dump import Store, convert_jsonl, load_dump
    from strata_lab.replayer import native
    from strata_lab.replayer.core import resolve_options
    from strata_lab.replayer.fast import domain_rows, fit_cost_store
    from strata_lab.replayer.native import domain_batches

    mb = os.path.getsize(path) / 2**20
    print(f"\n== {name}: {calls} calls, {mb:.1f} MB JSONL")
    store = os.path.join(tmp, f"{name}-store")
    t0 = time.perf_counter()
    info = convert_jsonl(path, store)
    t_conv = time.perf_counter() - t0
    pq_mb = info["bytes_out"] / 2**20
    print(f"size      : JSONL {mb:8.1f} MB | Parquet {pq_mb:7.2f} MB | {mb / pq_mb:5.1f}x smaller (target >= 10x)")

    def ours():
        assert sum(1 for _ in load_dump(path)) == calls

    def plain():
        with open(path, "rb") as f:
            assert sum(1 for line in f if json.loads(line)) == calls

    st = Store(store)

    def read_store():  # what any replay must do at least: read every row of the store (as Python values)
        assert sum(1 for _ in domain_rows(st.partitions)) == calls

    def read_arrow():  # stricter: the store's batches in seq order, no Python value per row
        assert sum(b.num_rows for parts in st.domains().values() for b in domain_batches(parts)) == calls

    t_ours, t_plain, t_read = best_of(ours), best_of(plain), best_of(read_store)
    t_arrow = best_of(read_arrow)
    print(f"ingest    : load_dump (orjson) {mb / t_ours:7.1f} MB/s | json.loads {mb / t_plain:7.1f} MB/s | "
          f"{t_plain / t_ours:.2f}x")
    print(f"convert   : JSONL -> Parquet {mb / t_conv:7.1f} MB/s | store read {mb / t_read:7.1f} MB/s of JSONL "
          f"({calls / t_read:.0f} calls/s)")

    # the store replay first, in a clean heap; the old path after it (it holds the whole dump in memory)
    t_new = best_of(lambda: replay(store, tokenizer=tok), n=2)
    new = replay(store, tokenizer=tok)
    new_frame = new.to_frame()
    c_read, c_new = best_cpu_pair(read_store, lambda: replay(store, tokenizer=tok))
    t0 = time.perf_counter()
    old = replay(path, tokenizer=tok)
    t_old = time.perf_counter() - t0
    assert new_frame.equals(old.to_frame()), "store replay differs from the JSONL replay"
    ids = old["prompt_tokens"]
    del old
    from strata_lab.caches.call_ids import calls_from_dump

    t0 = time.perf_counter()
    replay(calls_from_dump(st), tokenizer=tok)   # the store call by call: what replay(store) did before issue 51
    t_calls = time.perf_counter() - t0
    print(f"replay    : old (JSONL records) {calls / t_old:8.0f} calls/s {ids / t_old / 1e6:7.2f} M ids/s")
    print(f"            store call by call  {calls / t_calls:8.0f} calls/s | {t_read / t_calls:.2f}x the plain store "
          "read (replay(store) before issue 51)")
    print(f"            new (store, delta)  {calls / t_new:8.0f} calls/s {ids / t_new / 1e6:7.2f} M ids/s | "
          f"{t_old / t_new:.1f}x the old path; {t_read / t_new:.2f}x the plain store read (target >= 0.5x); "
          f"{t_arrow / t_new:.2f}x reading its Arrow batches only")
    print(f"            new in CPU time     {c_new * 1e3:8.0f} ms | plain store read {c_read * 1e3:.0f} ms | "
          f"{c_read / c_new:.2f}x the plain store read (target >= 0.5x)")
    opts = resolve_options()
    cm = fit_cost_store(st)

    def per_domain(fn):
        return lambda: [fn(parts, opts, tok, cm) for parts in st.domains().values()]

    t_core = best_of(per_domain(native.replay_domain))
    print(f"            C++ replay core {calls / t_core:8.0f} calls/s | Python reference (store call by call) "
          f"{calls / t_calls:8.0f} calls/s | {t_calls / t_core:.1f}x")
    if baseline is not None:
        b_calls, b_ids, b_dt = min((baseline_rate(baseline, path) for _ in range(2)), key=lambda t: t[2])
        assert b_calls == calls
        rev = subprocess.run(["git", "-C", baseline, "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True).stdout.strip() or os.path.basename(baseline)
        print(f"            baseline (rev {rev}, same dump) {b_calls / b_dt:6.0f} calls/s "
              f"{b_ids / b_dt / 1e6:5.2f} M ids/s | new is {b_dt / t_new:.1f}x (target >= 30x)")
    small = os.path.join(tmp, f"{name}-small.jsonl")
    with open(path, "rb") as src, open(small, "wb") as dst:
        for i, line in enumerate(src):
            if i >= args.replay_calls:
                break
            dst.write(line)
    t0 = time.perf_counter()
    rep = replay(small)  # as this benchmark measured replay before: tokenizer load included
    dt = time.perf_counter() - t0
    print(f"            today's line ({rep['calls']} calls, tokenizer load included) {rep['calls'] / dt:8.0f} "
          f"calls/s {rep['prompt_tokens'] / dt / 1e6:.2f} M ids/s | new is {calls / t_new / (rep['calls'] / dt):.1f}x")

    if not args.no_dask:
        from distributed import Client, LocalCluster

        for workers in (1, 2):
            with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                              dashboard_address=":0") as lc, Client(lc) as client:
                from strata_lab.replayer.distributed import _worker_tokenizer

                # tokenizer and its bytes table (the replay core's byte walk) loaded on every worker
                client.run(lambda: _worker_tokenizer("qwen3").vocab_bytes() and None)
                client.run(_warm_worker)  # and the replay's modules imported on every worker, not just one
                replay(store, tokenizer="qwen3", cluster=client)  # and the replay's modules imported
                t0 = time.perf_counter()
                d = replay(store, tokenizer="qwen3", cluster=client)
                t_d = time.perf_counter() - t0
            assert d.to_frame().equals(new.to_frame()), "dask replay differs"
            print(f"dask      : {workers} worker(s) {calls / t_d:8.0f} calls/s {ids / t_d / 1e6:7.2f} M ids/s | "
                  f"{t_new / t_d:.2f}x in-process ({len(st.domains())} cache domains)")

    load = "import gc, strata_lab as sl; tok = sl.load_tokenizer('qwen3'); tok.token_bytes(0); gc.collect()"
    base, rss_old = peak_rss_mib(load, f"r = sl.replay({path!r}, tokenizer=tok)")
    _, rss_new = peak_rss_mib(load, f"r = sl.replay({store!r}, tokenizer=tok)")
    print(f"peak RSS  : tokenizer loaded {base:6.0f} MiB | during old replay {rss_old:6.0f} MiB | during store "
          f"replay {rss_new:6.0f} MiB | growth {rss_new - base:.0f} vs {rss_old - base:.0f} MiB "
          f"({(rss_new - base) / max(rss_old - base, 1):.2f}x); logical trace {mb:.0f} MB")


def tile_store(src: str, dst: str, copies: int) -> int:
    """`copies` copies of store `src` in `dst`, one after another: copy c renames sessions and request ids
    (suffix ~c), shifts seq by c x rows, and becomes segment c of each partition (parent rows shifted with
    it). Returns the rows written. Arrow does the work column-wise; nothing is replayed or decoded."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from strata_lab.dump.store_writer import _DICTIONARY_COLUMNS, partitions, segment_files

    parts = {os.path.relpath(p, src): pq.read_table(segment_files(p)[0]) for p in partitions(src)}
    for p in partitions(src):
        assert len(segment_files(p)) == 1, "tile_store reads one segment per partition"
    total = sum(t.num_rows for t in parts.values())
    for rel, t in parts.items():
        os.makedirs(os.path.join(dst, rel), exist_ok=True)
        n = t.num_rows
        for c in tqdm(range(copies), desc=f"tile {rel}", unit="copy", leave=False):
            tag = pa.scalar(f"~{c}")
            parent = t["parent_call"]
            cols = {
                "seq": pc.add(t["seq"], c * total),
                "session": pc.binary_join_element_wise(t["session"], tag, ""),
                "request_id": pc.binary_join_element_wise(t["request_id"], tag, ""),
                "parent_call": pc.if_else(pc.less(parent, 0), parent, pc.add(parent, c * n)),
            }
            out = t
            for k, v in cols.items():
                out = out.set_column(out.schema.get_field_index(k), k, v.cast(t.schema.field(k).type))
            pq.write_table(out, os.path.join(dst, rel, f"seg-{c:06d}.parquet"), compression="zstd",
                           use_dictionary=_DICTIONARY_COLUMNS)  # as the store writer writes them
    return total * copies


def bench_big(fleet_path: str, fleet_store: str, tmp: str, gb: float) -> None:
    """Replay a store of `gb` GB logical JSONL (the fleet store, tiled): calls/s and the peak RSS."""
    from strata_lab.dump import Store

    mb = os.path.getsize(fleet_path) / 2**20
    copies = max(1, round(gb * 1024 / mb))
    big = os.path.join(tmp, "big-store")
    t0 = time.perf_counter()
    rows = tile_store(fleet_store, big, copies)
    store_mb = sum(os.path.getsize(f) for f in Store(big).paths) / 2**20
    print(f"\n== big: {copies} copies of the fleet trace = {copies * mb / 1024:.1f} GB logical JSONL, {rows} calls, "
          f"store {store_mb:.0f} MB (tiled in {time.perf_counter() - t0:.0f} s)")
    load = "import gc, time, strata_lab as sl; tok = sl.load_tokenizer('qwen3'); tok.token_bytes(0); gc.collect()"
    code = (f"t0 = time.perf_counter(); r = sl.replay({big!r}, tokenizer=tok); dt = time.perf_counter() - t0\n"
            "print('RATE', r['calls'] / dt, r['prompt_tokens'] / dt / 1e6, r['calls'])")
    base, peak, out = peak_rss_mib(load, code, with_output=True)
    rate, ids_rate, calls = out.split("RATE")[-1].split()
    assert int(calls) == rows
    print(f"replay    : {float(rate):8.0f} calls/s {float(ids_rate):7.2f} M ids/s in-process")
    print(f"peak RSS  : tokenizer loaded {base:6.0f} MiB | during the replay {peak:6.0f} MiB (target < 1024 MiB for "
          f"20 GB logical); growth {peak - base:.0f} MiB = {(peak - base) * 2**20 / rows:.0f} bytes a call")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=16.0, help="size of the random-id dump")
    ap.add_argument("--sessions", type=int, default=40, help="sessions of the generated fleet")
    ap.add_argument("--tile", type=int, default=6, help="copies of the generated fleet")
    ap.add_argument("--replay-calls", type=int, default=300)
    ap.add_argument("--no-dask", action="store_true")
    ap.add_argument("--baseline-rev", default=BASELINE_REV, help="git rev whose replay is the 30x baseline")
    ap.add_argument("--baseline-dir", default=None, help="an already built checkout of the baseline")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--big-gb", type=float, default=0.0, help="also replay a tiled store of this many GB logical")
    args = ap.parse_args()
    import strata_lab as sl

    tok = sl.load_tokenizer("qwen3")
    tok.token_bytes(0)  # build the byte table once, outside every timing
    baseline = baseline_checkout(args)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "random.jsonl")
        bench_workload("random", path, make_dump(path, args.mb), tok, tmp, args, baseline)
        path = os.path.join(tmp, "fleet.jsonl")
        t0 = time.perf_counter()
        n = make_fleet(path, args.sessions, args.tile, tok)
        print(f"\n(fleet generated in {time.perf_counter() - t0:.0f} s)")
        bench_workload("fleet", path, n, tok, tmp, args, baseline)
        if args.big_gb > 0:
            bench_big(path, os.path.join(tmp, "fleet-store"), tmp, args.big_gb)


if __name__ == "__main__":
    main()
