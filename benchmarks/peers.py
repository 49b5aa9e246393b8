"""The peers of engine.py and hybrid.py: transformers and llama.cpp, each run on the same model folder in
a fresh interpreter (`in_subprocess`), returning (prefill tok/s, decode tok/s).

Peers never share strata's process: torch ships its own libgomp.so.1, and once it is loaded strata's OpenMP
loops run on it (measured ~20-40x slower on the hybrid MoE decode), which would slow strata in every round
after the first. The llama.cpp peer reads a GGUF of the folder (strata_lab.tiny.gguf_export: qwen3 or
qwen3next; f16 or Q8_0, with "+fa" for flash attention), written beside it on first use; it needs
llama-cpp-python, which is not a project dependency, and reports its absence as an ImportError.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

_USER_ENV = set(os.environ)  # imported before strata_lab.engine adds its defaults

_LLAMA_INFO = [""]
_SHOWN: set[str] = set()  # peer info lines already printed by this process


def peer_env() -> dict[str, str]:
    """The peer's environment: OpenMP as its runtime defaults it (strata_lab.engine sets
    OMP_WAIT_POLICY=passive and GOMP_SPINCOUNT for its own process only when the user had not)."""
    env = dict(os.environ)
    for var in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        if var in env and var not in _USER_ENV:
            env.pop(var)
    return env


def bench_hf(path, prompt, n_decode, threads, dtype_name):
    """transformers on the folder: Qwen3 with eager attention (warm-up 16 tokens), Qwen3-Next with its
    default attention and the CPU torch fallback of its GDN kernels (warm-up 8); dtype "bf16"/"bfloat16"
    or "f32"/"float32"."""
    import torch
    from transformers import Qwen3ForCausalLM, Qwen3NextForCausalLM

    from hf_timing import prefill_decode_tok_s

    torch.set_num_threads(threads)
    dtype = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "f32": torch.float32,
             "float32": torch.float32}[dtype_name]
    if json.loads((Path(path) / "config.json").read_text())["model_type"] == "qwen3_next":
        model = Qwen3NextForCausalLM.from_pretrained(str(path), dtype=dtype).eval()
        return prefill_decode_tok_s(model, prompt, n_decode, warm=8)
    model = Qwen3ForCausalLM.from_pretrained(str(path), dtype=dtype, attn_implementation="eager").eval()
    return prefill_decode_tok_s(model, prompt, n_decode, warm=16)


def bench_llama(path, prompt, n_decode, threads, qtype="f16"):
    """llama.cpp on a GGUF of the folder: one prefill of ``prompt`` (micro-batches of 512), then greedy
    decode of ``n_decode`` tokens; ``qtype`` "f16" or "q8_0", "+fa" for flash attention."""
    try:
        import gguf  # noqa: F401
        import llama_cpp
    except ImportError as e:
        raise ImportError(f"{e.name} is not installed (pip install gguf llama-cpp-python)") from e
    from strata_lab.tiny.gguf_export import gguf_file

    flash = qtype.endswith("+fa")
    qtype = qtype.removesuffix("+fa")
    model_path = gguf_file(path, qtype)
    llm = llama_cpp.Llama(model_path=str(model_path), n_ctx=len(prompt) + n_decode + 16,
                          n_batch=min(len(prompt), 2048), n_ubatch=min(len(prompt), 512), flash_attn=flash,
                          n_threads=threads, n_threads_batch=threads, logits_all=False, verbose=False)
    _LLAMA_INFO[0] = "  llama.cpp build: " + llama_cpp.llama_print_system_info().decode().strip()
    V = llm.n_vocab()

    def last_argmax():  # logits of the last evaluated token (logits_all=False keeps only that row)
        return int(np.argmax(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(V,))))

    llm.eval(prompt[:16])  # warm up (page in weights)
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt)
    t1 = time.perf_counter()
    nxt = last_argmax()
    t2 = time.perf_counter()
    for _ in range(n_decode):
        llm.eval([nxt])
        nxt = last_argmax()
    t3 = time.perf_counter()
    return len(prompt) / (t1 - t0), n_decode / (t3 - t2)


def write_ggufs(path, qtypes) -> bool:
    """Write the folder's GGUFs for ``qtypes`` (a no-op for those already there) and flush them to disk,
    before anything is timed: a llama.cpp peer timed while the kernel still wrote back its freshly written
    f16 GGUF decoded 4-8 tok/s here against 55-66 once it was on disk. False when llama-cpp-python is not
    installed (nothing written)."""
    import importlib.util

    if not importlib.util.find_spec("llama_cpp"):
        return False
    from strata_lab.tiny.gguf_export import gguf_file

    for q in qtypes:
        gguf_file(path, q.removesuffix("+fa"))
    os.sync()
    return True


def in_subprocess(kind, path, prompt, n_decode, threads, extra, omp_passive=False):
    """Run peer ``kind`` ("hf": transformers, ``extra`` its dtype; "llama": llama.cpp, ``extra`` its qtype)
    in a fresh interpreter and return (prefill, decode) tok/s. A missing package raises ImportError, a
    case the peer does not run raises NotImplementedError, a crash RuntimeError. ``omp_passive``: the peer's
    OpenMP threads wait at barriers as strata's do (OMP_WAIT_POLICY=passive, a short GOMP_SPINCOUNT) instead of its default; on
    the shared 2 cores under load, llama.cpp Q8_0 decoded 2.4-11.6 tok/s with the default and 48-50 with
    passive in one interleaved run."""
    import subprocess

    env = peer_env()
    if omp_passive:  # strata's own settings (its defaults, or what the user set)
        env["OMP_WAIT_POLICY"] = os.environ.get("OMP_WAIT_POLICY", "passive")
        if "GOMP_SPINCOUNT" in os.environ:
            env["GOMP_SPINCOUNT"] = os.environ["GOMP_SPINCOUNT"]

    job = json.dumps({"kind": kind, "path": str(path), "prompt": list(prompt), "decode": n_decode,
                      "threads": threads, "extra": extra})
    r = subprocess.run([sys.executable, __file__], input=job, capture_output=True, text=True, env=env)
    for line in r.stdout.splitlines():
        if line.startswith("PEER "):
            res = json.loads(line[5:])
            if "error" in res:
                raise (ImportError if res["type"] == "ImportError" else NotImplementedError)(res["error"])
            if res.get("info") and res["info"] not in _SHOWN:
                _SHOWN.add(res["info"])
                print(res["info"], flush=True)
            return res["prefill"], res["decode"]
    raise RuntimeError(f"peer {kind} failed: {r.stderr[-2000:]}")


def _peer_job() -> None:
    j = json.loads(sys.stdin.read())
    bench = bench_hf if j["kind"] == "hf" else bench_llama
    try:
        p, d = bench(Path(j["path"]), j["prompt"], j["decode"], j["threads"], j["extra"])
        print("PEER " + json.dumps({"prefill": p, "decode": d, "info": _LLAMA_INFO[0]}))
    except (ImportError, NotImplementedError) as e:
        print("PEER " + json.dumps({"error": str(e), "type": type(e).__name__}))


if __name__ == "__main__":
    _peer_job()
