"""The fidelity table (docs/FIDELITY.md): every row is one `python -m strata_lab.validate` command.

    STRATA_VLLM_PYTHON=/path/to/venv/bin/python python benchmarks/fidelity.py oracle   # vLLM's own cache code
    STRATA_VLLM_PYTHON=... python benchmarks/fidelity.py vllm                          # live vllm serve (slow)
    STRATA_LLAMA_SERVER=/path/to/llama-server python benchmarks/fidelity.py llama.cpp  # live llama-server
    STRATA_LLAMA_SERVER=... python benchmarks/fidelity.py llama.cpp-hybrid            # tiny Qwen3-Next GGUF

Prints one markdown row per command: engine, version, setting, workload, clients, calls, exact %,
token-weighted error, the command.
"""
from __future__ import annotations

import subprocess
import sys

AGENT = "agent:seed={seed},sessions=5,turns=6,system_len=120,turn_len=40,max_tokens=9"
WORKLOADS = [AGENT.format(seed=1), AGENT.format(seed=2) + ",p_retry=0.4,p_drop=0.3", "dump:dumps/agent.jsonl",
             "dump:dumps/thinking.jsonl", "dump:dumps/webui.jsonl", "fleet:sessions=6,turns=2.0,seed=3,system_words=100,tool_words=60"]
ORACLE_ARGS = ["--block-size 16", "--block-size 32", "--block-size 16 --num-gpu-blocks-override 60",
               "--block-size 16 --num-gpu-blocks-override 200", "--block-size 32 --num-gpu-blocks-override 100",
               "--block-size 4 --num-gpu-blocks-override 400"]
# a bounded pool must hold one request of max_model_len ids (vLLM checks at start): --max-model-len with it
LIVE_VLLM = [("--block-size 32", AGENT.format(seed=1), 1),
             ("--block-size 32 --num-gpu-blocks-override 30 --max-model-len 900", AGENT.format(seed=1), 1),
             ("--block-size 32 --num-gpu-blocks-override 30 --max-model-len 900", "dump:dumps/agent.jsonl", 1),
             ("--block-size 32", AGENT.format(seed=3), 4),
             ("--block-size 32 --num-gpu-blocks-override 40 --max-model-len 1200", AGENT.format(seed=3), 4)]
LIVE_LLAMA = [("-np 1 -c 4096 --cache-ram 0", AGENT.format(seed=1), 1), ("-np 1 -c 4096", AGENT.format(seed=1), 1),
              ("-np 2 -c 8192", AGENT.format(seed=2) + ",p_retry=0.4,p_drop=0.3", 1),
              ("-np 4 -c 16384", AGENT.format(seed=1), 1), ("-np 4 -c 16384 --cache-ram 0", AGENT.format(seed=1), 1),
              ("-np 2 -c 8192 --cache-reuse 16", AGENT.format(seed=2) + ",p_edit=0.5", 1),
              ("-np 1 -c 1024 -sps 0", AGENT.format(seed=1), 1), ("-np 1 -c 600", AGENT.format(seed=1), 1),
              ("-np 2 -kvu -c 8192 --no-cache-idle-slots", AGENT.format(seed=1), 1),
              ("-np 2 -c 4096 --cache-ram 1", AGENT.format(seed=2) + ",p_retry=0.4,p_drop=0.3", 1),
              ("-np 2 -c 4096 --cache-ram 1 -sps 0", AGENT.format(seed=1), 1),
              ("-np 2 -kvu -c 512 --no-cache-idle-slots -sps 0", AGENT.format(seed=1), 1),
              ("-np 3 -kvu -c 768 --no-cache-idle-slots -sps 0", AGENT.format(seed=2) + ",p_retry=0.4,p_drop=0.3", 1),
              ("", AGENT.format(seed=1), 1), ("", "dump:dumps/agent.jsonl", 1),
              ("-np 4 -c 16384", "fleet:sessions=6,turns=2.0,seed=3,system_words=100,tool_words=60", 1),
              ("-np 4 -c 16384", AGENT.format(seed=1), 4)]


HYB = "agent:seed={seed},sessions=3,turns=5,system_len=120,turn_len=40,max_tokens=9"
LIVE_LLAMA_HYBRID = [("-np 1 -c 4096 --cache-ram 0", HYB.format(seed=1)), ("-np 1 -c 4096", HYB.format(seed=1)),
                     ("-np 1 -c 4096 --cache-ram 0 -cms 64 --ctx-checkpoints 8 -ub 64", HYB.format(seed=1)),
                     ("-np 2 -c 8192 --ctx-checkpoints 2 -ub 64", HYB.format(seed=2))]


def rows(which: str):
    if which == "oracle":
        return [("vllm-oracle", a, w, 1) for a in ORACLE_ARGS for w in WORKLOADS]
    if which == "vllm":
        return [("vllm", a, w, c) for a, w, c in LIVE_VLLM]
    if which == "llama.cpp":
        return [("llama.cpp", a, w, c) for a, w, c in LIVE_LLAMA]
    if which == "llama.cpp-hybrid":   # the tiny Qwen3-Next GGUF (context checkpoints)
        return [("llama.cpp", a, w, 1) for a, w in LIVE_LLAMA_HYBRID]
    raise SystemExit(f"which must be oracle, vllm, llama.cpp or llama.cpp-hybrid, got {which!r}")


def oracle_table() -> int:
    """All oracle rows with one vLLM process (its import dominates a run)."""
    from strata_lab.validate.compare import compare
    from strata_lab.validate.vllm_check import run_oracle_many
    from strata_lab.validate.workloads import parse_workload

    todo = [(a, w) for a in ORACLE_ARGS for w in WORKLOADS]
    res = run_oracle_many([(parse_workload(w), a) for a, w in todo])
    for (args, workload), (rows, version) in zip(todo, res):
        cmd = f"python -m strata_lab.validate vllm-oracle --args '{args}' --workload '{workload}'"
        if rows is None:
            print(f"| vllm (KVCacheManager) | 0.32.0 | `{args}` | {workload} | 1 | n/a: {version} | | | | `{cmd}` |")
            continue
        c = compare(rows, f"vllm:args={args}", "vllm")
        print(f"| vllm (KVCacheManager) | {version} | `{args}` | {workload} | 1 | {c.calls} | {c.exact_rate:.1%} | "
              f"{c.token_error:.3%} | {c.evictions} | `{cmd}` |", flush=True)
        for i in c.differ[:5]:
            print(f"<!-- call {i}: engine {rows[i][2]}, strata {c.predicted[i]} ({c.causes[i]}) -->")
    return 0


def main(which: str) -> int:
    from tqdm.auto import tqdm

    if which == "oracle":
        return oracle_table()

    for engine, args, workload, clients in tqdm(rows(which), desc=f"fidelity {which}", unit="run"):
        cmd = [sys.executable, "-m", "strata_lab.validate", engine, "--args", args, "--workload", workload,
               "--clients", str(clients)] + (["--model", "qwen3-next"] if which == "llama.cpp-hybrid" else [])
        r = subprocess.run(cmd, capture_output=True, text=True)
        line = next((ln for ln in r.stdout.splitlines() if ln.count("|") >= 7), None)
        shown = " ".join(f"'{c}'" if " " in c or not c else c for c in cmd[1:])
        if line is None:
            print(f"| {engine} | failed (rc {r.returncode}): {r.stderr.strip().splitlines()[-1:]} | `python {shown}` |",
                  flush=True)
            continue
        print("| " + line + f" | `python {shown}` |", flush=True)
        print(f"<!-- {line} -->", flush=True)
        for extra in r.stdout.splitlines()[1:]:   # every differing call, then the causes
            print(f"<!-- {extra.strip()} -->", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "oracle"))
