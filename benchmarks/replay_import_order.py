"""Does a store replay before `Engine.load` change the engine's decode speed? (issue 27)

The replay core is its own extension (`strata_lab._replay`, no OpenMP) and `strata_lab/_native.py` is the only
importer of both extensions, so a replay loads no OpenMP runtime and the engine still sets libgomp's wait
policy (passive, GOMP_SPINCOUNT=20000) before libgomp loads. One run, one fresh process per mode, no OMP_* /
GOMP_* variable set in any of them:

- A `engine-first`: Engine.load, then decode N tokens;
- B `replay-first`: a store replay (the shipped dumps/agent.jsonl converted to a store), then Engine.load and
  the same decode;
- C `libgomp-first` (control): libgomp.so.1 loaded before the engine, as the replay did when its core lived
  in the OpenMP-linked engine extension: libgomp keeps its default spinning wait and the engine warns.

The three processes stay alive and decode in turn, round after round, so each round compares the modes
under the same machine load. Reports decode tok/s, the ratios B/A and C/A (median of the paired ratios),
the wait policy libgomp actually used (OMP_DISPLAY_ENV, printed by libgomp when it loads) and whether an
OpenMP warning appeared on each child's stderr. Writes benchmarks/results/replay_import_order.md.

    PYTHONPATH=$PWD python benchmarks/replay_import_order.py [--tokens 32] [--rounds 30] [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("engine-first", "replay-first", "libgomp-first")
# a small Qwen3-shaped model: decode steps of a few ms with many OpenMP regions each
SHAPE = dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4, head_dim=64,
             intermediate_size=1536, vocab_size=8192, tie_word_embeddings=True)


def child(args) -> None:
    """A fresh process in one mode: set up, load the engine, then decode once per "go" line on stdin, printing
    one JSON line each (the parent interleaves the modes' decodes in time)."""
    replay_s = None
    if args.child == "libgomp-first":
        import ctypes

        ctypes.CDLL("libgomp.so.1", mode=ctypes.RTLD_GLOBAL)
    elif args.child == "replay-first":
        import strata_lab as sl

        t = time.perf_counter()
        sl.replay(args.store)
        replay_s = time.perf_counter() - t
    from strata_lab import _native
    from strata_lab.engine import Engine

    gomp_before_engine = _native.libgomp_mapped()
    engine = Engine.load(args.model, threads=args.threads)
    s = engine.session("bench")
    prompt = list(range(1, 33))
    s.generate(prompt, max_new_tokens=8).result  # warm-up
    print(json.dumps({"ready": True, "gomp_before_engine": gomp_before_engine, "replay_s": replay_s,
                      "env": [os.environ.get("OMP_WAIT_POLICY"), os.environ.get("GOMP_SPINCOUNT")]}), flush=True)
    for line in sys.stdin:
        if line.strip() != "go":
            break
        s.reset()
        r = s.generate(prompt, max_new_tokens=args.tokens).result
        print(json.dumps({"decode_tps": len(r.gen_ids) / (r.decode_ms / 1000)}), flush=True)


def start_child(mode: str, model: Path, store: Path, args) -> tuple[subprocess.Popen, dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
    env["OMP_DISPLAY_ENV"] = "VERBOSE"  # libgomp prints what it read when it loaded
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", mode, "--model", str(model), "--store",
           str(store), "--tokens", str(args.tokens), "--threads", str(args.threads)]
    err = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    proc.err = err
    line = proc.stdout.readline()
    if not line:
        proc.wait(timeout=60)
        err.seek(0)
        raise RuntimeError(f"{mode} failed:\n{err.read()[-3000:]}")
    return proc, json.loads(line)


def decode(proc) -> float:
    proc.stdin.write("go\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError("a child process ended early")
    return json.loads(line)["decode_tps"]


def finish_child(proc, info: dict) -> dict:
    proc.stdin.write("quit\n")
    proc.stdin.close()
    proc.wait(timeout=60)
    proc.err.seek(0)
    stderr = proc.err.read()
    shown = dict(re.findall(r"^\s+(\w+) = '([^']*)'", stderr, flags=re.M))
    info["libgomp_wait"] = f"{shown.get('OMP_WAIT_POLICY', '?')} / spin {shown.get('GOMP_SPINCOUNT', '?')}"
    info["openmp_warning"] = any("Warning" in line and re.search(r"OpenMP|libgomp|OMP_", line)
                                 for line in stderr.splitlines())
    return info


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=32, help="decode steps per measurement")
    ap.add_argument("--rounds", type=int, default=30, help="rounds (each: one decode in every mode's process)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    if not 1 <= args.rounds <= 200 or not 1 <= args.tokens <= 4096:
        raise SystemExit("--rounds must be in 1..200 and --tokens in 1..4096")

    from tqdm import tqdm

    from strata_lab.dump import convert_jsonl
    from strata_lab.tiny import make_tiny

    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny(Path(tmp) / "model", "qwen3", "tiny", dtype="bfloat16", overrides=SHAPE)
        store = Path(tmp) / "store"
        convert_jsonl(str(ROOT / "dumps" / "agent.jsonl"), str(store))
        load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        procs = {m: start_child(m, model, store, args) for m in tqdm(MODES, desc="processes")}
        tps: dict[str, list[float]] = {m: [] for m in MODES}
        try:
            for k in tqdm(range(args.rounds), desc="rounds"):
                order = MODES[k % 3:] + MODES[:k % 3]  # each mode takes each place in turn
                for m in order:
                    tps[m].append(decode(procs[m][0]))
        finally:
            info = {m: finish_child(*procs[m]) for m in MODES}

    base = tps["engine-first"]
    pairs = {m: [x / a for x, a in zip(tps[m], base)] for m in MODES}
    ratio = {m: statistics.median(pairs[m]) for m in MODES}
    iqr = {m: statistics.quantiles(pairs[m], n=4)[::2] if len(pairs[m]) > 1 else [ratio[m]] * 2 for m in MODES}
    med = {m: statistics.median(tps[m]) for m in MODES}
    lines = ["# Store replay before Engine.load: decode speed and OpenMP settings (issue 27)", "",
             f"Qwen3-shaped random model (hidden {SHAPE['hidden_size']}, {SHAPE['num_hidden_layers']} layers, bf16), "
             f"{args.threads} threads, {args.tokens} decode steps per decode. One fresh process per mode, all "
             f"alive at once; {args.rounds} rounds, each one decode per process in turn (order rotating), so "
             "every round compares the modes under the same machine load; ratio: median over rounds of "
             "(mode / engine-first). No OMP_*/GOMP_* variable set. `python benchmarks/replay_import_order.py`.", "",
             "| mode | decode tok/s (median) | vs engine-first (median of paired ratios) | quartiles | libgomp "
             "loaded before the engine | libgomp's wait (as it loaded) | OpenMP warning |",
             "|---|---:|---:|---|---|---|---|"]
    for m in MODES:
        i = info[m]
        lines.append(f"| {m} | {med[m]:.1f} | {ratio[m]:.3f} | {iqr[m][0]:.2f}-{iqr[m][1]:.2f} | "
                     f"{i['gomp_before_engine']} | {i['libgomp_wait']} | "
                     f"{i['openmp_warning']} |")
    lines += ["", f"replay-first / engine-first decode: **{ratio['replay-first']:.3f}**; libgomp-first (what a replay "
              f"did before the replay core had its own extension) / engine-first: {ratio['libgomp-first']:.3f}. "
              f"Store replay in the replay-first process: {info['replay-first']['replay_s']:.1f} s. Machine load "
              f"average {load0:.1f} at the start, {os.getloadavg()[0] if hasattr(os, 'getloadavg') else float('nan'):.1f}"
              f" at the end ({os.cpu_count()} cores).",
              "", "Per round (tok/s): " + "; ".join(f"{m}: " + ", ".join(f"{x:.0f}" for x in tps[m]) for m in MODES)]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "replay_import_order.md").write_text(text)


if __name__ == "__main__":
    main()
