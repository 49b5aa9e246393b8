"""Does a store replay before `Engine.load` change the engine's decode speed? (issue 27)

The replay core is its own extension (`strata_lab._replay`, no OpenMP) and `strata_lab/_native.py` is the only
importer of both extensions, so a replay loads no OpenMP runtime and the engine still sets libgomp's wait
policy (passive, GOMP_SPINCOUNT=20000) before libgomp loads. One run, fresh processes, rounds interleaved,
no OMP_* / GOMP_* variable set in any of them:

- A `engine-first`: Engine.load, then decode N tokens;
- B `replay-first`: a store replay (the shipped dumps/agent.jsonl converted to a store), then Engine.load and
  the same decode;
- C `libgomp-first` (control): libgomp.so.1 loaded before the engine, as the replay did when its core lived
  in the OpenMP-linked engine extension: libgomp keeps its default spinning wait and the engine warns.

Reports decode tok/s (median over rounds), the ratios B/A and C/A, the wait policy libgomp actually used
(OMP_DISPLAY_ENV, printed by libgomp when it loads) and whether an OpenMP warning appeared on each child's
stderr. Writes benchmarks/results/replay_import_order.md.

    PYTHONPATH=$PWD python benchmarks/replay_import_order.py [--tokens 96] [--rounds 3] [--threads 2]
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
    """One measurement in this (fresh) process; prints one JSON line."""
    t0 = time.perf_counter()
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
    best = None
    for _ in range(2):
        s.reset()
        r = s.generate(prompt, max_new_tokens=args.tokens).result
        tps = len(r.gen_ids) / (r.decode_ms / 1000)
        best = tps if best is None else max(best, tps)
    print(json.dumps({"mode": args.child, "decode_tps": best, "gomp_before_engine": gomp_before_engine,
                      "replay_s": replay_s, "wall_s": time.perf_counter() - t0,
                      "env": [os.environ.get("OMP_WAIT_POLICY"), os.environ.get("GOMP_SPINCOUNT")]}), flush=True)


def run_child(mode: str, model: Path, store: Path, args) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
    env["OMP_DISPLAY_ENV"] = "VERBOSE"  # libgomp prints what it read when it loaded
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", mode, "--model", str(model), "--store",
           str(store), "--tokens", str(args.tokens), "--threads", str(args.threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{mode} failed:\n{out.stderr[-3000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    shown = dict(re.findall(r"^\s+(\w+) = '([^']*)'", out.stderr, flags=re.M))
    res["libgomp_wait"] = f"{shown.get('OMP_WAIT_POLICY', '?')} / spin {shown.get('GOMP_SPINCOUNT', '?')}"
    res["openmp_warning"] = any("Warning" in line and re.search(r"OpenMP|libgomp|OMP_", line)
                                for line in out.stderr.splitlines())
    return res


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=96, help="decode steps per measurement")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (each: one process per mode)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    if not 1 <= args.rounds <= 20 or not 1 <= args.tokens <= 4096:
        raise SystemExit("--rounds must be in 1..20 and --tokens in 1..4096")

    from tqdm import tqdm

    from strata_lab.dump import convert_jsonl
    from strata_lab.tiny import make_tiny

    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny(Path(tmp) / "model", "qwen3", "tiny", dtype="bfloat16", overrides=SHAPE)
        store = Path(tmp) / "store"
        convert_jsonl(str(ROOT / "dumps" / "agent.jsonl"), str(store))
        runs: dict[str, list[dict]] = {m: [] for m in MODES}
        with tqdm(total=args.rounds * len(MODES), desc="processes") as bar:
            for _ in range(args.rounds):
                for mode in MODES:
                    runs[mode].append(run_child(mode, model, store, args))
                    bar.update()

    med = {m: statistics.median(r["decode_tps"] for r in runs[m]) for m in MODES}
    lines = ["# Store replay before Engine.load: decode speed and OpenMP settings (issue 27)", "",
             f"Qwen3-shaped random model (hidden {SHAPE['hidden_size']}, {SHAPE['num_hidden_layers']} layers, bf16), "
             f"{args.threads} threads, {args.tokens} decode steps, best of 2 per process, median of {args.rounds} "
             "processes per mode, modes interleaved; no OMP_*/GOMP_* variable set. `python "
             "benchmarks/replay_import_order.py`.", "",
             "| mode | decode tok/s (median) | vs engine-first | libgomp loaded before the engine | libgomp's wait "
             "(as it loaded) | OpenMP warning |", "|---|---:|---:|---|---|---|"]
    for m in MODES:
        rs = runs[m]
        lines.append(f"| {m} | {med[m]:.1f} | {med[m] / med['engine-first']:.3f} | "
                     f"{sorted({r['gomp_before_engine'] for r in rs})} | {sorted({r['libgomp_wait'] for r in rs})} | "
                     f"{sorted({r['openmp_warning'] for r in rs})} |")
    lines += ["", f"replay-first / engine-first decode: **{med['replay-first'] / med['engine-first']:.3f}**; "
              f"libgomp-first (the old order's effect) / engine-first: {med['libgomp-first'] / med['engine-first']:.3f}.",
              "", "Per process (tok/s): " + "; ".join(
                  f"{m}: " + ", ".join(f"{r['decode_tps']:.1f}" for r in runs[m]) for m in MODES)]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "replay_import_order.md").write_text(text)


if __name__ == "__main__":
    main()
