"""Decode at a long context with the q8 KV cache, two builds turn by turn (issue 32): the measure of
q8_decode_engine.py (the --preset shape with --layers layers, bf16 random weights, kv_cache="q8", --threads threads,
one --context-token prefill, then decodes of --decode tokens from the held prompt with the per-op timers), but both
builds (a PYTHONPATH each: --a, e.g. a copy of strata_lab/ holding another _engine .so, and --b) stay loaded in
their own process and take turns, one round each, --rounds times (the first of each pair alternating). This
machine's memory bandwidth shifts by up to 1.7x within minutes (the non-attention part of a full-depth decode
step ran at 20 ms in one run and 36 ms in the next), so only rounds taken side by side compare.

Printed per round and build: decode tok/s, attention ms per token, its share of the timed decode ops, and the rest.

    python benchmarks/kernels/q8_decode_engine_ab.py --a /path/old --b $PWD [--layers 28] [--rounds 6]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from q8_decode_engine import add_args


def child(args):
    from q8_decode_engine import held_session, profiled_round  # (sets STRATA_PROFILE before the engine loads)

    ext, s, prompt, secs, _ = held_session(args)
    print(json.dumps({"ready": secs, "level": ext.kernel_level()}), flush=True)
    for line in sys.stdin:
        if line.strip() != "go":
            break
        print(json.dumps(profiled_round(ext, s, prompt, args.decode)), flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", help="PYTHONPATH of build a")
    ap.add_argument("--b", help="PYTHONPATH of build b")
    add_args(ap)
    ap.set_defaults(layers=28)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    if not (args.a and args.b):
        ap.error("--a and --b are required")
    common = ["--preset", args.preset, "--layers", str(args.layers), "--context", str(args.context), "--decode",
              str(args.decode), "--threads", str(args.threads), "--child"]
    procs = {}
    for name, path in (("a", args.a), ("b", args.b)):  # one prefill at a time
        p = subprocess.Popen([sys.executable, os.path.abspath(__file__), *common], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": path})
        info = json.loads(p.stdout.readline())
        print(f"{name}: level {info['level']}, prefill + first decode {info['ready']:.1f} s", flush=True)
        procs[name] = p
    rows = {"a": [], "b": []}
    try:
        for rnd in range(args.rounds):
            for name in ("a", "b") if rnd % 2 == 0 else ("b", "a"):
                p = procs[name]
                p.stdin.write("go\n")
                p.stdin.flush()
                r = json.loads(p.stdout.readline())
                rows[name].append(r)
                print(f"round {rnd + 1} {name}: decode {r['tok_s']:.2f} tok/s, attention {r['att_ms']:.2f} ms/token = "
                      f"{r['share']:.1f} % of decode, the rest {r['rest_ms']:.2f} ms/token", flush=True)
    finally:
        for p in procs.values():
            p.stdin.close()
            p.wait()
    for name in ("a", "b"):
        att = sorted(r["att_ms"] for r in rows[name])
        share = sorted(r["share"] for r in rows[name])
        print(f"{name}: attention ms/token median {att[len(att) // 2]:.2f} (min {att[0]:.2f}), share median "
              f"{share[len(share) // 2]:.1f} % (min {share[0]:.1f} %)")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
