"""`python -m strata_lab.validate ENGINE --args FLAGS --workload SPEC [--out DUMP]`: serve a workload on a
real engine, replay the same calls through strata's model configured from the same flags, print the
fidelity row and write a dump carrying both numbers per call.

ENGINE: `vllm-oracle` (vLLM's own KVCacheManager in-process), `vllm` (a live `vllm serve` on a tiny Qwen3
folder), `llama.cpp` (a live `llama-server` on a tiny GGUF; `STRATA_LLAMA_SERVER` names the binary).
"""
from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m strata_lab.validate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("engine", choices=["vllm-oracle", "vllm", "llama.cpp"])
    ap.add_argument("--args", default="", help="the engine's own flags (strata's model reads the same)")
    ap.add_argument("--workload", default="agent", help="agent[:k=v,...] | fleet[:k=v,...] | dump:PATH")
    ap.add_argument("--clients", type=int, default=1, help="concurrent clients (live engines)")
    ap.add_argument("--model", default="qwen3", choices=["qwen3", "qwen3-next"],
                    help="tiny model kind for live engines")
    ap.add_argument("--out", help="write the served calls with both numbers (strata-dump/1)")
    ap.add_argument("--log", help="engine log file (live engines)")
    a = ap.parse_args(argv)
    workload = _checked(ap, a)
    try:
        return _run(a, workload)
    except (RuntimeError, ValueError, TypeError, OSError, ImportError) as exc:  # an engine missing or failing
        print(f"{ap.prog}: error: {str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}",
              file=sys.stderr)
        return 1


def _checked(ap: argparse.ArgumentParser, a: argparse.Namespace):
    """Every argument checked before any engine starts (a bad one: a one-line usage error, exit 2); the workload."""
    import os

    from strata_lab.caches.presets import parse_engine
    from strata_lab.validate.workloads import parse_workload

    if not 1 <= a.clients <= 256:
        ap.error(f"--clients must be in 1..256, got {a.clients}")
    try:
        parse_engine(f"{'llama.cpp' if a.engine == 'llama.cpp' else 'vllm'}:args={a.args}")
    except ValueError as exc:
        ap.error(f"--args: {exc}")
    for flag, path in (("--out", a.out), ("--log", a.log)):
        if path is not None:
            folder = os.path.dirname(os.path.abspath(path))
            if os.path.isdir(path) or not os.path.isdir(folder) or not os.access(folder, os.W_OK):
                ap.error(f"{flag}: cannot write {path!r} (not a file in a writable folder)")
    try:
        first = parse_workload(a.workload)
        # a generator checks its arguments when it starts: start one, then take a fresh one
        empty = next(first, None) is None
    except (ValueError, TypeError, OSError, KeyError) as exc:
        ap.error(f"--workload {a.workload!r}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
    if empty:
        ap.error(f"--workload {a.workload!r}: holds no calls")
    return parse_workload(a.workload)


def _run(a: argparse.Namespace, workload) -> int:
    from strata_lab.validate.compare import compare, explain, write_dump

    if a.engine == "vllm-oracle":
        from strata_lab.validate.vllm_check import run_oracle

        rows, version = run_oracle(workload, a.args)
        engine, spec = "vllm", f"vllm:args={a.args}"
    elif a.engine == "vllm":
        from strata_lab.validate.vllm_check import run_live, tiny_folder

        rows, version = run_live(workload if a.clients == 1 else a.workload, tiny_folder(), a.args,
                                 clients=a.clients, log=a.log)
        engine, spec = "vllm", f"vllm:args={a.args}"
    else:
        from strata_lab.validate.llamacpp_check import run_live as run_llama, tiny_gguf

        rows, version = run_llama(workload if a.clients == 1 else a.workload, tiny_gguf(a.model), a.args,
                                  clients=a.clients, log=a.log)
        # the replay sizes saved prompts (--cache-ram) with the served GGUF's own KV shape
        engine, spec = "llama.cpp", f"llama.cpp:model=tiny-qwen3,args={a.args}"
        if a.model != "qwen3":
            spec = f"llama.cpp:model=qwen3-next-80b-a3b,args={a.args}"
    comp = compare(rows, spec, engine)
    print(f"{engine} {version} | {a.args or '(defaults)'} | {a.workload} | clients {a.clients} | {comp.calls} calls | "
          f"{comp.exact_rate:.1%} exact | token-weighted error {comp.token_error:.3%} | {comp.evictions} evictions")
    for i in comp.differ:
        req, _out, rep = rows[i]
        print(f"  call {i} ({req.session}, {len(req.prompt)} ids): engine {rep}, strata {comp.predicted[i]} "
              f"({comp.causes[i]}): {explain(comp, i)}")
    if comp.differ and all(rows[i][0].slot is not None for i in comp.differ):
        from collections import Counter

        from strata_lab.validate.compare import explain_slot

        counts = Counter(explain_slot(comp, i)[0] for i in comp.differ)
        print("  causes: " + "; ".join(f"{c}: {n}" for c, n in counts.most_common()))
    if a.out:
        write_dump(a.out, comp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
