"""Prefill/decode speed of strata_lab's engine (bf16 weights, and int8 quantised at load: int8 x int8-quantised
activations; --int8-ab adds the int8 path with f32 activations it replaced) against
transformers (eager, bf16 and f32) and, when installed, llama.cpp (llama-cpp-python + gguf: f16 and Q8_0
GGUFs of the same weights), on one random-weight Qwen3-0.6B-shaped model folder, at one or more context lengths.

    PYTHONPATH=$PWD python benchmarks/engine.py [--contexts 512 4096] [--decode 128] [--threads 2]
        [--repeat 2] [--skip strata,hf,hf-f32,llama,llama-q8,llama-fa,int8,accuracy,scaling] [--attn-ab]
        [--out benchmarks/results]

Concurrency (issue 32): `--streams 1 2 4 8 --prefill 64 --decode 32` runs benchmarks/concurrency.py instead:
N concurrent greedy streams on `strata-lab serve --slots N` and `llama-server -np N` (same weights, one
run; aggregate and per-stream tok/s, time to first token), written to concurrency.md in --out.

Long context (issue 18): `--contexts 256 4096 16384 --decode 16 --skip hf,hf-f32,int8,accuracy,scaling
--attn-ab` prefills 4K and 16K prompts and decodes at that context for strata and llama.cpp in one run.
strata's per-op timers (STRATA_PROFILE=1, on in this script) give attention's share of prefill and decode
time at each context (--kv-q8 adds the q8 KV cache's row and its logit error against the f32 cache, issue 32); --attn-ab adds a row with the attention kernel strata had before the tiled one (the
per-query scalar loop): its prefill up to --ab-max-context (an hour per 16K prefill on 2 cores) and its
decode at every context (the same held prompt, cut back and decoded again).

Prints one markdown table (system x context: prefill and decode tok/s, ratios against strata bf16), the
decode bandwidth limit measured in the same run (a read loop over a buffer the size of the bytes one
decode step streams, with the same threads) and each strata row's fraction of it at every context, the cost growth with
context, 1 vs N threads, and int8 accuracy against the bf16 weights computed in f32 (max logit error,
greedy agreement). Writes the table (engine.md) and a plot of tok/s against context (engine.png) to
--out. The model folder and GGUFs are cached under build/bench/.

The llama.cpp peer is optional and skipped (with a note) when absent; without llama-cpp-python it runs through
`llama-server` ($STRATA_LLAMA_SERVER or PATH; one slot, the f16 GGUF and its f16 KV cache, rows "llama.cpp
f16" and "llama.cpp f16 +fa": flash attention off and on; prefill and decode tok/s from the server's own
timings). llama-cpp-python needs packages that are not project dependencies (it compiles llama.cpp, minutes
on 2 cores):

    pip install gguf diskcache
    CMAKE_ARGS="-DGGML_NATIVE=OFF" pip install llama-cpp-python

transformers runs only up to --hf-max-context (eager attention materialises [heads, n, n] scores).
llama.cpp prefills in micro-batches of 512 tokens (its default n_ubatch; one batch of n would need a
[heads, n, n] score buffer, 16 GiB at 16K) without flash attention (its default; --llama-flash-attn).
The decode bandwidth limit counts the weights and the KV cache a step reads at that context (f32 or f16, as
the engine holds it). Its fraction (every strata row, every context) alternates the two sides: --interleaved-rounds
rounds of one read pass (kernels::read_bandwidth: the same threads, a buffer of that many bytes on huge pages as
the weights are, one untimed pass first) then 8 decode steps from the same held context, and takes the medians.
Each round waits (at most --quiet-wait seconds) for a 0.5 s window in which other processes used under
--quiet-cores cores, and records the cores they used during the round (/proc/stat less this process's CPU time):
on a shared box a process that takes a core costs a decode step (~150 parallel loops) a scheduler wake-up per
loop, and the single long read pass far less, so the fraction is quoted over the quiet rounds and, beside it,
over all rounds with the others' load. (A best-of-N read pass against a separately timed decode, the method
before, took its limit from whichever pass met the quietest moment: 61.5 against ~36 GB/s in the other rows.)
strata picks its kernels at run time (avx512bf16 > avx512 > avx2 > scalar; STRATA_KERNEL=avx2 caps it).
OpenMP threads spin briefly, then sleep at barriers (OMP_WAIT_POLICY=passive with GOMP_SPINCOUNT=20000, set
by strata_lab.engine unless the user set either): on shared or oversubscribed cores long-spinning waiters
starve the working threads, and sleeping at once costs a wake-up per parallel region.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
from pathlib import Path

import numpy as np

import bandwidth
from peers import in_subprocess, write_ggufs  # records the user's environment before strata_lab.engine loads

os.environ.setdefault("STRATA_PROFILE", "1")  # per-op timers: attention's share (read before the module loads)

ROOT = Path(__file__).resolve().parents[1]


def model_folder(preset: str, layers: int | None = None) -> Path:
    """The cached random-weight model folder of ``preset``; ``layers``: the same layer shape, fewer layers."""
    from strata_lab.tiny import make_tiny

    path = ROOT / "build" / "bench" / (f"{preset}-bf16" if layers is None else f"{preset}-{layers}L-bf16")
    if not (path / "config.json").exists():
        print(f"writing the {preset} bf16 model folder to {path} ...", flush=True)
        make_tiny(path, preset=preset, dtype="bfloat16", seed=0,
                  overrides=None if layers is None else {"num_hidden_layers": layers})
    return path


_ENGINES: dict = {}


def strata_engine(path, threads, weights, max_context, kv_cache="auto"):
    from strata_lab.engine import Engine

    key = (str(path), threads, weights, kv_cache)
    if key not in _ENGINES:  # int8 quantises at load: once per run
        _ENGINES[key] = Engine.load(path, threads=threads, weights=weights, max_context=max_context,
                                    kv_cache=kv_cache)
    return _ENGINES[key]


PROFILES: dict = {}  # (system, context) -> {"prefill"/"decode": attention's share of the timed ops}


def _attention_share(prof, phase):
    secs = prof[phase]["seconds"]
    total = sum(secs.values())
    return secs.get("attention", 0.0) / total if total > 0 else float("nan")


DECODE_AB: dict = {}  # context -> {"new"/"old": [decode tok/s per round], "prof_new"/"prof_old": ms/token per op}


def _decode_ms_per_token(prof):
    d = prof["decode"]
    return {op: sec * 1e3 / max(1, d["tokens"]) for op, sec in d["seconds"].items()}


def decode_ab(ext, s, prompt, n_decode, rounds):
    """Decode the held prompt again, alternating attn_decode off/on (the decode attention before and after
    the streaming decode path), rounds x 2 times; per-round tok/s and the per-op decode profile of each."""
    out = {"new": [], "old": [], "prof_new": {}, "prof_old": {}}
    try:
        for rnd in range(rounds):
            for on in ((False, True) if rnd % 2 == 0 else (True, False)):
                ext._set_kernel_option("attn_decode", on)
                ext._profile(True)
                r = s.generate(prompt, max_new_tokens=n_decode).result
                prof = ext._profile(True)
                assert r.tokens_read <= 1 and len(r.gen_ids) == n_decode, (r.tokens_read, len(prompt))
                key = "new" if on else "old"
                out[key].append(n_decode / (r.decode_ms / 1e3))
                if prof["enabled"]:
                    out["prof_" + key] = _decode_ms_per_token(prof)
    finally:
        ext._set_kernel_option("attn_decode", True)
    return out


def bench_strata(path, prompt, n_decode, threads, weights=None, max_context=None, name=None, old_attention=None,
                 int8_dot=True, decode_ab_rounds=0, kv_cache="auto"):
    """strata prefill and decode tok/s. old_attention: None (the tiled kernel), "decode" (also decode the held
    prompt again with the old per-query attention and return that decode rate too), "all" (old kernel for
    both prefill and decode). int8_dot=False: int8 weights widened to f32 against f32 activations (the path
    before int8 activations). kv_cache: Engine.load's ("auto": f16 for bf16 and int8 weights)."""
    from strata_lab.engine import _ext

    ext = _ext()
    eng = strata_engine(path, threads, weights, max_context, kv_cache)
    s = eng.session("bench")
    ext._set_kernel_option("int8_dot", int8_dot)
    s.reset()
    s.generate(prompt[:16], max_new_tokens=2).result  # warm up (page in weights)
    s.reset()
    ext._set_kernel_option("attn_tiled", old_attention != "all")
    try:
        ext._profile(True)
        r = s.generate(prompt, max_new_tokens=n_decode).result
        prof = ext._profile(True)
        assert len(r.gen_ids) == n_decode
        old_d = None
        if old_attention == "decode":  # same held prompt: cut back to it (1 token re-read), decode again
            ext._set_kernel_option("attn_tiled", False)
            r2 = s.generate(prompt, max_new_tokens=n_decode).result
            assert r2.tokens_read <= 1 and len(r2.gen_ids) == n_decode, (r2.tokens_read, r2.reused, len(prompt))
            old_d = n_decode / (r2.decode_ms / 1e3)
        if decode_ab_rounds:
            DECODE_AB[len(prompt)] = decode_ab(ext, s, prompt, n_decode, decode_ab_rounds)
    finally:
        ext._set_kernel_option("attn_tiled", True)
        ext._set_kernel_option("int8_dot", True)
    s.reset()
    if name and prof["enabled"]:
        PROFILES[(name, len(prompt))] = {ph: _attention_share(prof, ph) for ph in ("prefill", "decode")}
    p, d = len(prompt) / (r.prefill_ms / 1e3), n_decode / (r.decode_ms / 1e3)
    return (p, d, old_d) if old_attention == "decode" else (p, d)


def llama_server_binary():
    import shutil

    return os.environ.get("STRATA_LLAMA_SERVER") or shutil.which("llama-server")


def llama_server_extra(specs):
    """--llama-server LABEL=PATH values -> [(label, path)]; a bad value or a missing binary is an error."""
    out = []
    for spec in specs:
        label, sep, binary = spec.partition("=")
        if not sep or not label or not binary:
            raise SystemExit(f"--llama-server: expected LABEL=PATH, got {spec!r}")
        if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
            raise SystemExit(f"--llama-server {label}: {binary!r} is not an executable file")
        out.append((label, binary))
    return out


def bench_llama_server(path, prompt, n_decode, threads, flash_attn, binary=None):
    """llama.cpp through one `llama-server` slot (when llama-cpp-python is not installed): the f16 GGUF, its
    default f16 KV cache, flash attention on or off; one greedy /completion of ``prompt`` (token ids, no
    prompt cache) and its own timings (prompt and predicted tokens per second). binary: the llama-server
    to run (default llama_server_binary())."""
    import httpx
    from concurrency import _free_port, _Server
    from strata_lab.tiny.gguf_export import gguf_file

    gguf = gguf_file(path, "f16")
    os.sync()
    port = _free_port()
    argv = [binary or llama_server_binary(), "-m", str(gguf), "-np", "1", "-c", str(len(prompt) + n_decode + 16), "-t",
            str(threads), "-tb", str(threads), "-fa", "on" if flash_attn else "off", "--host", "127.0.0.1",
            "--port", str(port), "--no-warmup"]
    env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "passive"),
           "GOMP_SPINCOUNT": os.environ.get("GOMP_SPINCOUNT", "20000")}
    srv = _Server({"args": argv, "env": env}, port).wait()
    try:
        body = {"prompt": list(prompt), "n_predict": n_decode, "temperature": 0, "ignore_eos": True,
                "cache_prompt": False}
        r = httpx.post(srv.url + "/completion", json=body, timeout=7200)
        r.raise_for_status()
        t = r.json()["timings"]
        if t["predicted_n"] != n_decode or t["prompt_n"] != len(prompt):
            raise RuntimeError(f"llama-server read {t['prompt_n']} and decoded {t['predicted_n']} tokens")
        return t["prompt_per_second"], t["predicted_per_second"]
    finally:
        srv.stop()


def bench_hf_ctx(path, prompt, n_decode, threads, dtype_name, max_ctx):
    if len(prompt) > max_ctx:
        raise NotImplementedError(f"context {len(prompt)} > --hf-max-context {max_ctx}")
    return in_subprocess("hf", path, prompt, n_decode, threads, dtype_name)


def int8_accuracy(path, threads, n_tokens, max_context, int8_dot=True):
    """int8 weights against the bf16 weights computed in f32 (strata's f32 path: the exact upcast):
    max |logit error| over a teacher-forced forward and greedy agreement over ``n_tokens`` generated ones.
    int8_dot: activations quantised to int8 too (default), else f32 activations."""
    from strata_lab.engine import _ext

    ref = strata_engine(path, threads, None, max_context)
    q8 = strata_engine(path, threads, "int8", max_context)
    prompt = np.random.default_rng(1).integers(0, 151669, 32).tolist()
    s = ref.session("acc")
    s.reset()
    gen = s.generate(prompt, max_new_tokens=n_tokens).result.gen_ids
    s.reset()
    ids = prompt + gen
    a = ref.forward(ids)
    _ext()._set_kernel_option("int8_dot", int8_dot)
    try:
        b = q8.forward(ids)
    finally:
        _ext()._set_kernel_option("int8_dot", True)
    lo = len(prompt) - 1
    err = float(np.max(np.abs(a[lo:] - b[lo:])))
    scale = float(np.max(np.abs(a[lo:])))
    agree = float(np.mean(np.argmax(b[lo:-1], axis=1) == np.asarray(gen)))
    return err, scale, agree


def kv_q8_accuracy(path, threads, prompt, n_tokens, max_context):
    """The q8 KV cache against the f32 cache (bf16 weights both): the f32 cache's greedy continuation of
    ``prompt`` (``n_tokens`` ids), then both engines teacher-forced over it (each prefix's last logits, read
    by cutting the held ids back to it: one token read per step); max |logit error|, the largest |logit| and
    greedy agreement."""
    ref = strata_engine(path, threads, None, max_context, "f32")
    q8 = strata_engine(path, threads, None, max_context, "q8")
    s = ref.session("kv-acc")
    s.reset()
    gen = s.generate(prompt, max_new_tokens=n_tokens).result.gen_ids
    logits = {}
    for name, eng in (("f32", ref), ("q8", q8)):
        se = eng.session("kv-acc")  # f32: still holding prompt + gen (each prefix below: a cut, 1 token read)
        rows = []
        for i in range(n_tokens):
            se.generate(prompt + gen[:i], max_new_tokens=0)
            rows.append(se.last_logits().copy())
        se.reset()
        logits[name] = np.stack(rows)
    err = float(np.max(np.abs(logits["f32"] - logits["q8"])))
    scale = float(np.max(np.abs(logits["f32"])))
    agree = float(np.mean(np.argmax(logits["q8"], axis=1) == np.asarray(gen)))
    return err, scale, agree


def markdown(rows, contexts, base="strata bf16"):
    out = ["| system | context | prefill tok/s | decode tok/s | prefill vs strata bf16 | decode vs strata bf16 |",
           "|---|---:|---:|---:|---:|---:|"]
    for name in dict.fromkeys(n for n, _ in rows):
        for c in contexts:
            if (name, c) not in rows:
                continue
            p, d = rows[(name, c)]
            bp, bd = rows.get((base, c), (float("nan"), float("nan")))
            pt, pr = (f"{p:.1f}", f"{p / bp:.2f}") if p == p else ("not run", "")
            out.append(f"| {name} | {c} | {pt} | {d:.2f} | {pr} | {d / bd:.2f} |")
    return "\n".join(out)


def plot(rows, contexts, out_png, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name in dict.fromkeys(n for n, _ in rows):
        cs = [c for c in contexts if (name, c) in rows]
        for ax, i in zip(axes, (0, 1)):
            pts = [(c, rows[(name, c)][i]) for c in cs if rows[(name, c)][i] == rows[(name, c)][i]]
            ax.plot([c for c, _ in pts], [y for _, y in pts], marker="o", label=name)
    for ax, what in zip(axes, ("prefill", "decode")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel(f"{what} tok/s")
        ax.set_title(what)
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)


def main(argv=None):
    import platform

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="qwen3-0.6b")
    ap.add_argument("--layers", type=int, default=None,
                    help="the preset's layer shape with only this many layers (long contexts in bounded time)")
    ap.add_argument("--contexts", type=int, nargs="+", default=[512],
                    help="prompt lengths: prefill of that many tokens, then decode at that context")
    ap.add_argument("--prefill", type=int, default=None, help="alias for a single --contexts value")
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds over all systems; best tok/s per system (shared machines are noisy)")
    ap.add_argument("--skip", default="",
                    help="comma list of: strata (bf16), hf, hf-f32, llama, llama-q8, llama-fa (the llama-server "
                         "+fa rows), int8, accuracy, scaling")
    ap.add_argument("--hf-max-context", type=int, default=2048)
    ap.add_argument("--attn-ab", action="store_true",
                    help="add 'strata bf16 old attention' (the per-query scalar attention) to the table")
    ap.add_argument("--ab-max-context", type=int, default=4096,
                    help="longest context whose prefill --attn-ab runs with the old attention (decode: all)")
    ap.add_argument("--int8-ab", action="store_true",
                    help="add 'strata int8 f32 act' (int8 weights widened to f32, f32 activations: the int8 path "
                         "before int8_dot) to the table and its accuracy")
    ap.add_argument("--decode-ab", type=int, default=0, metavar="ROUNDS",
                    help="after strata bf16's decode, decode the held prompt again ROUNDS x 2 times alternating "
                         "the attn_decode kernel option off/on; adds 'strata bf16 old decode attention' (decode "
                         "only) and prints the per-op decode profile of both")
    ap.add_argument("--kv-f32", action="store_true",
                    help="add 'strata bf16 kv f32': the KV cache in f32 (Engine.load kv_cache='f32'; twice the cache "
                         "bytes of the default f16 cache of bf16 weights)")
    ap.add_argument("--kv-q8", action="store_true",
                    help="add 'strata bf16 kv q8': the KV cache as int8 blocks of 32 with an f16 scale (Engine.load "
                         "kv_cache='q8', llama.cpp's q8_0; 1.0625 bytes per value against the default f16 cache's "
                         "2), and its logit "
                         "error against the f32 cache (unless --skip accuracy)")
    ap.add_argument("--llama-flash-attn", action="store_true", help="llama.cpp with flash_attn=True")
    ap.add_argument("--llama-server", action="append", default=[], metavar="LABEL=PATH",
                    help="add 'llama.cpp f16 LABEL' (and its +fa row unless --skip llama-fa): the llama-server at "
                         "PATH, beside $STRATA_LLAMA_SERVER's 'llama.cpp f16', e.g. avx2=<the binary printed by "
                         "scripts/build_llama_server.sh --isa avx2> (repeatable)")
    ap.add_argument("--llama-passive", action="store_true",
                    help="add 'llama.cpp f16 passive': llama.cpp f16 with its OpenMP threads waiting at barriers as "
                         "strata's do (OMP_WAIT_POLICY=passive; its default spins, which collapses on shared, "
                         "loaded cores)")
    ap.add_argument("--q8-max-context", type=int, default=None,
                    help="run llama.cpp Q8_0 only up to this context (long prefills take tens of minutes)")
    ap.add_argument("--accuracy-tokens", type=int, default=256)
    ap.add_argument("--interleaved-rounds", type=int, default=8,
                    help="the bandwidth fraction of every strata row at every context: rounds of one read pass then "
                         "8 decode steps, medians. Its fresh session prefills that context once more (minutes at "
                         "16K); 0 skips it")
    ap.add_argument("--quiet-cores", type=float, default=0.25,
                    help="a round is quiet when other processes used fewer cores than this during it")
    ap.add_argument("--quiet-wait", type=float, default=20.0,
                    help="seconds a round waits at most for a 0.5 s window under --quiet-cores before it runs anyway")
    ap.add_argument("--wait-quiet", action="store_true",
                    help="before every system's run in every round, wait (at most --quiet-wait seconds) for a 0.5 s "
                         "window in which other processes used under --quiet-cores cores (a shared box: the best "
                         "of the rounds then compares the systems at quiet moments)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"), help="folder for engine.md/.png")
    ap.add_argument("--streams", type=int, nargs="+", default=None,
                    help="the concurrency axis instead (benchmarks/concurrency.py): N concurrent greedy streams on "
                         "`strata-lab serve --slots N` and `llama-server -np N`, e.g. --streams 1 2 4 8; writes "
                         "concurrency.md to --out")
    args = ap.parse_args(argv)
    if args.streams:
        import concurrency

        return concurrency.main(["--preset", args.preset, "--streams", *map(str, args.streams),
                                 "--prompt", str(args.prefill or min(args.contexts)), "--decode", str(args.decode),
                                 "--threads", str(args.threads), "--skip", args.skip,
                                 *(["--rounds", str(args.repeat)] if args.repeat > 1 else []),
                                 "--out", str(Path(args.out) / "concurrency.md"),
                                 *([] if args.layers is None else ["--layers", str(args.layers)])])
    contexts = [args.prefill] if args.prefill else sorted(args.contexts)
    skip = set(filter(None, args.skip.split(",")))
    unknown = skip - {"strata", "hf", "hf-f32", "llama", "llama-q8", "llama-fa", "int8", "accuracy", "scaling"}
    if unknown:
        raise SystemExit(f"--skip: unknown {', '.join(sorted(unknown))}")
    extra_servers = llama_server_extra(args.llama_server)
    if extra_servers and ("llama" in skip or importlib.util.find_spec("llama_cpp") or not llama_server_binary()):
        raise SystemExit("--llama-server needs the llama-server peer: no --skip llama, no llama-cpp-python, "
                         "and $STRATA_LLAMA_SERVER or llama-server on PATH")
    path = model_folder(args.preset, args.layers)
    rng_prompt = np.random.default_rng(0).integers(0, 151669, max(contexts)).tolist()
    max_ctx = max(contexts) + args.decode + 32
    from strata_lab.engine import _ext

    ext = _ext()
    T = args.threads
    head = (f"{args.preset}{'' if args.layers is None else f' ({args.layers} layers)'} bf16 weights, contexts {contexts}, decode {args.decode}, {T} threads, strata kernels "
            f"{ext.kernel_level()}, {platform.processor() or platform.machine()} ({os.cpu_count()} cpus)")
    print(head, flush=True)

    OLD = "strata bf16 old attention"
    old_decode = {}  # context -> decode tok/s with the old attention, measured right after strata bf16's

    OLD_DEC = "strata bf16 old decode attention"

    def strata_bf16(p):
        if args.decode_ab:
            pf, d = bench_strata(path, p, args.decode, T, None, max_ctx, "strata bf16", decode_ab_rounds=args.decode_ab)
            ab = DECODE_AB[len(p)]
            print(f"  decode A/B ctx {len(p)}: attn_decode on {['%.2f' % x for x in ab['new']]} tok/s, off "
                  f"{['%.2f' % x for x in ab['old']]} tok/s; best on/off x{max(ab['new']) / max(ab['old']):.2f}, "
                  f"median x{float(np.median(ab['new'])) / float(np.median(ab['old'])):.2f}", flush=True)
            for key in ("prof_new", "prof_old"):
                if ab[key]:
                    tot = sum(ab[key].values())
                    print(f"    decode profile attn_decode {'on ' if key == 'prof_new' else 'off'} (last round, "
                          f"ms/token): total {tot:.2f}; " + ", ".join(f"{op} {ms:.2f} ({ms / tot * 100:.0f}%)"
                          for op, ms in ab[key].items() if ms >= 0.005), flush=True)
            return pf, max(d, max(ab["new"]))
        if not args.attn_ab:
            return bench_strata(path, p, args.decode, T, None, max_ctx, "strata bf16")
        pf, d, od = bench_strata(path, p, args.decode, T, None, max_ctx, "strata bf16", old_attention="decode")
        old_decode[len(p)] = od
        return pf, d

    def strata_old(p):
        if len(p) > args.ab_max_context:  # prefill too slow: the decode measured with strata bf16's prompt
            return float("nan"), old_decode[len(p)]
        return bench_strata(path, p, args.decode, T, None, max_ctx, OLD, old_attention="all")

    systems = [] if "strata" in skip else [("strata bf16", strata_bf16)]
    if args.kv_f32 and "strata" not in skip:
        systems.append(("strata bf16 kv f32", lambda p: bench_strata(path, p, args.decode, T, None, max_ctx,
                                                                     "strata bf16 kv f32", kv_cache="f32")))
    if args.kv_q8 and "strata" not in skip:
        systems.append(("strata bf16 kv q8", lambda p: bench_strata(path, p, args.decode, T, None, max_ctx,
                                                                    "strata bf16 kv q8", kv_cache="q8")))
    if args.decode_ab and "strata" not in skip:
        systems.append((OLD_DEC, lambda p: (float("nan"), max(DECODE_AB[len(p)]["old"]))))
    if args.attn_ab:
        systems.append((OLD, strata_old))
    if "int8" not in skip:
        systems.append(("strata int8", lambda p: bench_strata(path, p, args.decode, T, "int8", max_ctx, "strata int8")))
        if args.int8_ab:
            systems.append(("strata int8 f32 act", lambda p: bench_strata(path, p, args.decode, T, "int8", max_ctx,
                                                                          "strata int8 f32 act", int8_dot=False)))
    if "hf" not in skip:
        systems.append(("transformers bf16",
                        lambda p: bench_hf_ctx(path, p, args.decode, T, "bf16", args.hf_max_context)))
        if "hf-f32" not in skip:
            systems.append(("transformers f32",
                            lambda p: bench_hf_ctx(path, p, args.decode, T, "f32", args.hf_max_context)))
    if "llama" not in skip and not importlib.util.find_spec("llama_cpp") and llama_server_binary():
        # no llama-cpp-python: llama.cpp f16 through llama-server, flash attention off and on
        for label, binary in [("", None)] + extra_servers:
            name = "llama.cpp f16" + (f" {label}" if label else "")
            systems.append((name, lambda p, b=binary: bench_llama_server(path, p, args.decode, T, False, b)))
            if "llama-fa" not in skip:
                systems.append((name + " +fa", lambda p, b=binary: bench_llama_server(path, p, args.decode, T, True, b)))
    elif "llama" not in skip:
        fa = "+fa" if args.llama_flash_attn else ""
        write_ggufs(path, ["f16"] + ([] if "llama-q8" in skip else ["q8_0"]))
        systems.append(("llama.cpp f16", lambda p: in_subprocess("llama", path, p, args.decode, T, "f16" + fa)))
        if args.llama_passive:
            systems.append(("llama.cpp f16 passive",
                            lambda p: in_subprocess("llama", path, p, args.decode, T, "f16" + fa, omp_passive=True)))
        if "llama-q8" not in skip:
            def q8(p):
                if args.q8_max_context is not None and len(p) > args.q8_max_context:
                    raise NotImplementedError(f"context {len(p)} > --q8-max-context {args.q8_max_context}")
                return in_subprocess("llama", path, p, args.decode, T, "q8_0" + fa)

            systems.append(("llama.cpp Q8_0", q8))

    cfg = json.loads((path / "config.json").read_text())
    kv_token_bytes = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * 4
    rows: dict = {}
    skipped = set()
    for rnd in range(args.repeat):
        for c in contexts:
            prompt = rng_prompt[:c]
            for name, fn in systems:
                if name in skipped:
                    continue
                if args.wait_quiet:
                    bandwidth.wait_quiet(args.quiet_cores, args.quiet_wait)
                try:
                    p, d = fn(prompt)
                except (ImportError, NotImplementedError) as e:
                    if isinstance(e, ImportError):
                        skipped.add(name)
                    print(f"  {name:18s} ctx {c:6d} skipped: {e}", flush=True)
                    continue
                best = rows.get((name, c), (0.0, 0.0))
                rows[(name, c)] = (max(best[0], p) if p == p else p, max(best[1], d))
                share = PROFILES.get((name, c))
                extra = (f"   attention {share['prefill'] * 100:.0f}% of prefill, {share['decode'] * 100:.0f}% of decode"
                         if share else "")
                print(f"  {name:18s} ctx {c:6d} prefill {p:8.1f} tok/s   decode {d:6.2f} tok/s{extra}", flush=True)
                partial = Path(args.out) / "engine.partial.md"  # the table so far, should a long run be cut short
                partial.parent.mkdir(parents=True, exist_ok=True)
                partial.write_text(f"{head}; round {rnd + 1} of {args.repeat}, in progress\n\n"
                                   + markdown(rows, contexts) + "\n")

    lines = [f"{head}; best of {args.repeat} round(s)", "", markdown(rows, contexts), ""]
    c0 = contexts[0]
    # The decode bandwidth fraction: read passes and decode steps alternated, medians (bandwidth.py).
    if args.interleaved_rounds > 0:
        for name, _ in systems:
            if not name.startswith("strata") or name in (OLD, OLD_DEC):
                continue
            wts = name.split()[1]
            kv = "f32" if name.endswith("kv f32") else "q8" if name.endswith("kv q8") else "auto"
            eng = strata_engine(path, T, None if wts == "bf16" else wts, max_ctx, kv)
            for c in contexts:
                if (name, c) not in rows:
                    continue
                # the weights and KV cache a step reads in the middle of the 8: f32 4 bytes a value, f16 2,
                # q8 1 + 4 / 32 (its scale)
                per_value = {"f32": 4.0, "f16": 2.0, "q8": 1.125}[eng.info["kv_cache"]]
                nbytes = eng.info["stream_bytes"] + int(kv_token_bytes * (c + 4) * per_value / 4)
                ext._set_kernel_option("int8_dot", not name.endswith("f32 act"))
                try:
                    res = bandwidth.interleaved(ext, eng, rng_prompt[:c], nbytes, T, args.interleaved_rounds,
                                                args.quiet_cores, args.quiet_wait,
                                                log=lambda m: print(m, flush=True))
                finally:
                    ext._set_kernel_option("int8_dot", True)
                line = f"- {name}, context {c}: " + bandwidth.describe(res, nbytes, T, args.quiet_cores)
                print(line, flush=True)
                lines.append(line)
    if len(contexts) > 1:
        for name in dict.fromkeys(n for n, _ in rows):
            cs = [c for c in contexts if (name, c) in rows]
            steps = list(zip(cs, cs[1:])) + ([(cs[0], cs[-1])] if len(cs) > 2 else [])
            for c_a, c_b in steps:
                a, b = rows[(name, c_a)], rows[(name, c_b)]
                pg = f"prefill time/token x{a[0] / b[0]:.2f}, " if a[0] == a[0] and b[0] == b[0] else ""
                lines.append(f"- cost growth {name}, context {c_a} -> {c_b} (x{c_b / c_a:.0f}): "
                             f"{pg}decode time/token x{a[1] / b[1]:.2f}")
    D, I, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    H, Hkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    mm_flops = 2 * L * (D * (H + 2 * Hkv) * hd + H * hd * D + 3 * D * I)  # per token, layer matmuls
    for (name, c), share in PROFILES.items():
        att = 4 * hd * H * L * (c + 1) / 2  # per prefill token: QK and PV over (c + 1) / 2 keys on average
        lines.append(f"- {name}, context {c}: attention is {share['prefill'] * 100:.1f}% of prefill time "
                     f"({att / (att + mm_flops) * 100:.1f}% of prefill FLOPs) and {share['decode'] * 100:.1f}% of "
                     f"decode time (STRATA_PROFILE per-op timers, last round)")
    if "scaling" not in skip and T > 1:
        p1, d1 = bench_strata(path, rng_prompt[:c0], args.decode, 1, None, max_ctx)
        nb = strata_engine(path, 1, None, max_ctx).info["stream_bytes"]
        bw1, bwT = ext.read_bandwidth(nb, 1, 1), ext.read_bandwidth(nb, T, 1)
        pT, dT = bench_strata(path, rng_prompt[:c0], args.decode, T, None, max_ctx)  # right after, same load
        lines.append(f"- threads 1 -> {T} (strata bf16, context {c0}, measured back to back): prefill {p1:.1f} -> "
                     f"{pT:.1f} tok/s (x{pT / p1:.2f}), decode {d1:.2f} -> {dT:.2f} tok/s (x{dT / d1:.2f}); read "
                     f"loop {bw1:.1f} -> {bwT:.1f} GB/s (x{bwT / bw1:.2f})")
    if "int8" not in skip and "accuracy" not in skip:
        for dot in (True, False) if args.int8_ab else (True,):
            err, scale, agree = int8_accuracy(path, T, args.accuracy_tokens, max_ctx, int8_dot=dot)
            what = "int8 (int8 activations, blocks of 32)" if dot else "int8 f32 act (weights widened to f32)"
            lines.append(f"- {what} vs bf16 weights in f32, {args.accuracy_tokens} greedy tokens teacher-forced: max "
                         f"|logit error| {err:.4f} (logits up to {scale:.2f}), greedy agreement {agree * 100:.1f}%")
    if args.kv_q8 and "accuracy" not in skip:
        short = np.random.default_rng(1).integers(0, 151669, 32).tolist()
        for prompt, n in ((short, args.accuracy_tokens), (rng_prompt[:contexts[-1]], args.decode)):
            err, scale, agree = kv_q8_accuracy(path, T, prompt, n, max_ctx)
            lines.append(f"- q8 KV cache (int8 blocks of 32, f16 scales) vs the f32 cache, bf16 weights, context "
                         f"{len(prompt)}, {n} greedy tokens teacher-forced: max |logit error| {err:.4f} (logits up "
                         f"to {scale:.2f}), greedy agreement {agree * 100:.1f}%")
    text = "\n".join(lines)
    print("\n" + text, flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "engine.md").write_text(text + "\n")
    plot(rows, contexts, out / "engine.png", head)
    (out / "engine.partial.md").unlink(missing_ok=True)
    print(f"wrote {out / 'engine.md'} and {out / 'engine.png'}")
    return rows


if __name__ == "__main__":
    main()
