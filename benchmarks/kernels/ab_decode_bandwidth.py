"""Decode bandwidth fraction of kernel-switch variants side by side (issue 32): for each context, rounds in
which every variant (in turn, the order rotated each round) runs benchmarks/bandwidth.py's round -- wait for
a quiet 0.5 s window, one read pass over the bytes a step reads, 8 decode steps from the same held context --
so each variant's fraction is measured against read passes taken under the same load as its own steps.

    PYTHONPATH=$PWD python benchmarks/kernels/ab_decode_bandwidth.py [--contexts 256 1024] [--rounds 8]
        [--variants attn_decode=0 ...]   (each variant: comma-separated switch=0/1 over the defaults)
        [--variants env:STRATA_KV_HUGEPAGES=0]   (env:VAR=VALUE: set while the variant's session is filled
                                                  and while it decodes; e.g. the KV cache's pages)

Every variant decodes its own session (the same prompt, filled under the variant's settings), so a setting
read when the cache is allocated (an env: entry) applies to its cache only.

Prints every round and, per context and variant, bandwidth.describe's line (quiet rounds and all rounds).
Importing benchmarks/engine.py turns the per-op timers on (STRATA_PROFILE=1), as in its own fraction.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
import bandwidth  # noqa: E402


def parse_variant(text: str) -> tuple[dict[str, bool], dict[str, str]]:
    """'switch=0/1,...,env:VAR=VALUE,...' -> (kernel switches, environment variables)."""
    out, env = {}, {}
    for part in filter(None, text.split(",")):
        if part.startswith("env:"):
            name, sep, val = part[4:].partition("=")
            if not sep or not name:
                raise SystemExit(f"--variants: '{part}' is not env:VAR=VALUE")
            env[name] = val
            continue
        name, sep, val = part.partition("=")
        if not sep or val not in ("0", "1"):
            raise SystemExit(f"--variants: '{part}' is not switch=0, switch=1 or env:VAR=VALUE")
        out[name] = val == "1"
    return out, env


def _attention_ms(prof) -> float | None:
    """Decode attention ms/token from a per-op profile (STRATA_PROFILE=1), None when the timers are off."""
    d = prof["decode"]
    if not prof["enabled"] or not d["tokens"]:
        return None
    return d["seconds"].get("attention", 0.0) * 1e3 / d["tokens"]


def _attention_line(rows, quiet_cores: float) -> str:
    """Per-op timers' decode attention (median ms/token and share of decode time, quiet rounds and all) and
    the process's CPU time per token (with --threads 1: the work, not the wait for a core)."""
    cpu = (f"; process CPU time (all threads, spin-waits included) {float(np.median([r[3] for r in rows])):.2f} "
           "ms/token (median, all rounds)")
    timed = [r for r in rows if r[0] is not None]
    if not timed:
        return cpu
    out = []
    for label, sel in (("quiet rounds", [r for r in timed if r[2] is not None and r[2] < quiet_cores]),
                       ("all rounds", timed)):
        if sel:
            out.append(f"{label} {float(np.median([r[0] for r in sel])):.2f} ms/token "
                       f"({float(np.median([r[0] / r[1] for r in sel])) * 100:.1f} % of decode time)")
    return "; decode attention (per-op timers): " + ", ".join(out) + cpu


class _Env:
    """Sets environment variables for a with-block, then restores them."""

    def __init__(self, env: dict[str, str]):
        self.env, self.saved = env, {}

    def __enter__(self):
        self.saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def main(argv=None):
    from engine import model_folder  # benchmarks/engine.py
    from strata_lab.engine import Engine, _ext

    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen3-0.6b")
    ap.add_argument("--contexts", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quiet-cores", type=float, default=0.25)
    ap.add_argument("--quiet-wait", type=float, default=20.0)
    ap.add_argument("--variants", nargs="+", default=["attn_decode=0"],
                    help="besides the defaults: switch=0/1[,switch=0/1...] over the defaults")
    args = ap.parse_args(argv)
    ext = _ext()
    parsed = {"defaults": ({}, {})} | {v: parse_variant(v) for v in args.variants}
    variants = {name: sw for name, (sw, _) in parsed.items()}
    envs = {name: env for name, (_, env) in parsed.items()}
    switches = {k for v in variants.values() for k in v}
    defaults = {k: ext._kernel_option(k) for k in switches}  # raises on an unknown switch, before any work
    eng = Engine.load(model_folder(args.preset), threads=args.threads, max_context=max(args.contexts) + 64)
    info = eng.info
    print(f"{args.preset}, kernels {ext.kernel_level()}, {args.threads} threads, kv cache {info['kv_cache']}", flush=True)
    per_value = {"f32": 4.0, "f16": 2.0, "q8": 1.125}[info["kv_cache"]]
    cfg = __import__("json").loads((model_folder(args.preset) / "config.json").read_text())
    kv_token_bytes = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg.get("head_dim", 128) * 4
    rng_prompt = np.random.default_rng(0).integers(0, 151669, max(args.contexts)).tolist()
    meter = bandwidth.LoadMeter()
    lines = []
    try:
        for c in args.contexts:
            nbytes = info["stream_bytes"] + int(kv_token_bytes * (c + args.steps / 2) * per_value / 4)
            names = list(variants)
            sessions = {}
            for i, name in enumerate(names):  # each variant its own session, filled under its settings
                for k in switches:
                    ext._set_kernel_option(k, variants[name].get(k, defaults[k]))
                with _Env(envs[name]):
                    s = sessions[name] = eng.session(f"ab{i}")
                    s.reset()
                    s.generate(rng_prompt[:c], max_new_tokens=0)
            held = sessions[names[0]].held_ids[:c]
            res = {name: [] for name in variants}
            attn = {name: [] for name in variants}  # (attention ms/token, decode ms/token, others' cores)
            for rnd in range(args.rounds):
                for name in names[rnd % len(names):] + names[:rnd % len(names)]:
                    for k in switches:
                        ext._set_kernel_option(k, variants[name].get(k, defaults[k]))
                    s = sessions[name]
                    bandwidth.wait_quiet(args.quiet_cores, args.quiet_wait)
                    meter.start()
                    gbs = ext.read_bandwidth(int(nbytes), args.threads, 1)
                    ext._profile(True)
                    cpu0 = time.process_time()
                    with _Env(envs[name]):
                        r = s.generate(held, max_new_tokens=args.steps).result
                    cpu = (time.process_time() - cpu0) * 1e3 / args.steps
                    att = _attention_ms(ext._profile(True))
                    attn[name].append((att, 1e3 / (args.steps / (r.decode_ms / 1e3)), meter.others(), cpu))
                    assert r.tokens_read <= 1 and len(r.gen_ids) == args.steps
                    o = bandwidth.Round(gbs, args.steps / (r.decode_ms / 1e3), meter.others())
                    res[name].append(o)
                    print(f"  context {c} round {rnd + 1} {name}: read {o.read_gbs:.1f} GB/s, decode "
                          f"{o.decode_tps:.2f} tok/s = {o.decode_tps * nbytes / 1e9 / o.read_gbs:.2f}, others "
                          + ("?" if o.others is None else f"{o.others:.2f} cores")
                          + ("" if attn[name][-1][0] is None else
                             f", attention {attn[name][-1][0]:.2f} ms/token")
                          + f", process CPU {attn[name][-1][3]:.2f} ms/token", flush=True)
            for s in sessions.values():
                s.reset()
            for name in names:
                lines.append(f"- {name}, context {c}: "
                             + bandwidth.describe(res[name], nbytes, args.threads, args.quiet_cores)
                             + _attention_line(attn[name], args.quiet_cores))
                print(lines[-1], flush=True)
    finally:
        for k, v in defaults.items():
            ext._set_kernel_option(k, v)
    print("\n".join(["", *lines]))


if __name__ == "__main__":
    main()
