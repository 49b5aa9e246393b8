"""Prefill/decode speed of strata_lab's engine vs transformers (eager, bf16 and f32) and, when installed,
llama.cpp (llama-cpp-python + gguf), on one random Qwen3-0.6B-shaped checkpoint with bf16 weights.

    PYTHONPATH=$PWD python benchmarks/engine.py [--prefill 512] [--decode 128] [--threads 2] [--skip hf,llama]

Prints tokens/s per system and ratios against strata. The checkpoint is cached under build/bench/.

The llama.cpp peer is optional and skipped (with a note) when absent; it needs two third-party packages
that are not project dependencies (llama-cpp-python compiles llama.cpp, minutes on 2 cores):

    pip install gguf
    CMAKE_ARGS="-DGGML_NATIVE=OFF" pip install llama-cpp-python

The same random weights are written once as a qwen3 GGUF (f16 matrices, f32 norms, the real Qwen3 vocab)
next to the checkpoint, and the llama.cpp build's CPU features are printed with its numbers. strata picks
its kernels at run time (avx512bf16 > avx512 > avx2 > scalar; STRATA_KERNEL=avx512 caps it).
"""
from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def checkpoint(preset: str) -> Path:
    from strata_lab.tiny import make_tiny

    path = ROOT / "build" / "bench" / f"{preset}-bf16"
    if not (path / "config.json").exists():
        print(f"writing {preset} bf16 checkpoint to {path} ...", flush=True)
        make_tiny(path, preset=preset, dtype="bfloat16", seed=0)
    return path


def bench_strata(path, prompt, n_decode, threads):
    from strata_lab.engine import Engine

    eng = Engine.load(path, threads=threads)
    s = eng.session("bench")
    s.generate(prompt[:16], max_new_tokens=2).result  # warm up (page in weights)
    s.reset()
    r = s.generate(prompt, max_new_tokens=n_decode).result
    assert len(r.gen_ids) == n_decode
    return len(prompt) / (r.prefill_ms / 1e3), n_decode / (r.decode_ms / 1e3)


def bench_hf(path, prompt, n_decode, threads, dtype_name):
    import torch
    from transformers import Qwen3ForCausalLM

    torch.set_num_threads(threads)
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[dtype_name]
    model = Qwen3ForCausalLM.from_pretrained(str(path), dtype=dtype, attn_implementation="eager").eval()
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        model(ids[:, :16])  # warm up
        t0 = time.perf_counter()
        out = model(ids, use_cache=True)
        t1 = time.perf_counter()
        cache, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        t2 = time.perf_counter()
        for _ in range(n_decode):
            out = model(nxt, past_key_values=cache, use_cache=True)
            cache, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        t3 = time.perf_counter()
    return len(prompt) / (t1 - t0), n_decode / (t3 - t2)


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a (single-file or sharded) safetensors checkpoint as float32 (bf16/f16/f32)."""
    files = sorted(path.glob("*.safetensors"))
    out = {}
    for f in files:
        raw = f.read_bytes()
        n = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8:8 + n])
        data = memoryview(raw)[8 + n:]
        for name, info in header.items():
            if name == "__metadata__":
                continue
            a, b = info["data_offsets"]
            buf, shape = data[a:b], info["shape"]
            if info["dtype"] == "BF16":
                arr = (np.frombuffer(buf, "<u2").astype(np.uint32) << 16).view(np.float32)
            elif info["dtype"] == "F16":
                arr = np.frombuffer(buf, "<f2").astype(np.float32)
            elif info["dtype"] == "F32":
                arr = np.frombuffer(buf, "<f4").copy()
            else:
                raise ValueError(f"{f.name}: tensor {name} has unsupported dtype {info['dtype']}")
            out[name] = arr.reshape(shape)
    return out


def write_gguf(path: Path, out: Path) -> Path:
    """Write the checkpoint at ``path`` as a llama.cpp qwen3 GGUF: matrices f16, norms f32, real Qwen3 vocab.

    Mirrors llama.cpp's convert_hf_to_gguf.py for Qwen3ForCausalLM: gpt2 BPE tokenizer with the qwen2
    pre-tokenizer, token types NORMAL / CONTROL (special added tokens) / USER_DEFINED / UNUSED ([PADn]
    rows past the tokenizer's vocab), no q/k permutation (NEOX RoPE), tied output unless lm_head exists.
    """
    import gguf

    from strata_lab import load_tokenizer

    cfg = json.loads((path / "config.json").read_text())
    tok = load_tokenizer("qwen3")
    tj = json.loads(tok.hf.to_str())
    V = int(cfg["vocab_size"])
    rev = {i: t for t, i in tj["model"]["vocab"].items()}
    added = {a["id"]: a for a in tj["added_tokens"]}
    tokens, types = [], []
    for i in range(V):
        if i in added:
            tokens.append(added[i]["content"])
            types.append(gguf.TokenType.CONTROL if added[i]["special"] else gguf.TokenType.USER_DEFINED)
        elif i in rev:
            tokens.append(rev[i])
            types.append(gguf.TokenType.NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]

    w = gguf.GGUFWriter(str(out), "qwen3")
    w.add_name("strata random " + path.name)
    w.add_context_length(int(cfg["max_position_embeddings"]))
    w.add_embedding_length(int(cfg["hidden_size"]))
    w.add_block_count(int(cfg["num_hidden_layers"]))
    w.add_feed_forward_length(int(cfg["intermediate_size"]))
    w.add_head_count(int(cfg["num_attention_heads"]))
    w.add_head_count_kv(int(cfg["num_key_value_heads"]))
    w.add_key_length(int(cfg["head_dim"]))
    w.add_value_length(int(cfg["head_dim"]))
    w.add_rope_freq_base(float(cfg["rope_theta"]))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(int(cfg["bos_token_id"]))
    w.add_eos_token_id(int(cfg["eos_token_id"]))
    w.add_pad_token_id(tok.token_id("<|endoftext|>"))
    w.add_add_bos_token(False)

    st = _read_safetensors(path)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    per_layer = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
                 "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                 "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
                 "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down"}
    for name, arr in st.items():
        if name in names:
            gname = names[name]
        else:
            m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.weight", name)
            if not m or m.group(2) not in per_layer:
                raise ValueError(f"no GGUF name for tensor {name}")
            gname = f"blk.{m.group(1)}.{per_layer[m.group(2)]}.weight"
        w.add_tensor(gname, arr.astype(np.float16) if arr.ndim == 2 else arr.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def gguf_checkpoint(path: Path) -> Path:
    out = path.parent / f"{path.name}-f16.gguf"
    if not out.exists():
        print(f"writing {out} ...", flush=True)
        tmp = out.with_suffix(".tmp")
        write_gguf(path, tmp)
        tmp.rename(out)
    return out


def bench_llama(path, prompt, n_decode, threads):
    try:
        import llama_cpp
        import gguf  # noqa: F401
    except ImportError as e:
        raise ImportError(f"{e.name} is not installed (pip install gguf llama-cpp-python)") from e

    model_path = gguf_checkpoint(path)
    llm = llama_cpp.Llama(model_path=str(model_path), n_ctx=len(prompt) + n_decode + 16, n_batch=len(prompt),
                          n_ubatch=len(prompt), n_threads=threads, n_threads_batch=threads, logits_all=False,
                          verbose=False)
    print("  llama.cpp build:", llama_cpp.llama_print_system_info().decode().strip(), flush=True)
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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="qwen3-0.6b")
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds over all systems; best tok/s per system (shared machines are noisy)")
    ap.add_argument("--skip", default="", help="comma list of: hf, hf-f32, llama")
    args = ap.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    path = checkpoint(args.preset)
    prompt = np.random.default_rng(0).integers(0, 151669, args.prefill).tolist()

    rows = {}
    from strata_lab.engine import _ext

    print(f"{args.preset} bf16 weights, prefill {args.prefill}, decode {args.decode}, {args.threads} threads, "
          f"strata kernels {_ext().kernel_level()}", flush=True)
    runs = [("strata", lambda: bench_strata(path, prompt, args.decode, args.threads))]
    if "hf" not in skip:
        runs.append(("transformers bf16", lambda: bench_hf(path, prompt, args.decode, args.threads, "bf16")))
    if "hf" not in skip and "hf-f32" not in skip:
        runs.append(("transformers f32", lambda: bench_hf(path, prompt, args.decode, args.threads, "f32")))
    if "llama" not in skip:
        runs.append(("llama.cpp", lambda: bench_llama(path, prompt, args.decode, args.threads)))
    for rnd in range(args.repeat):
        for name, fn in runs:
            try:
                p, d = fn()
            except (ImportError, NotImplementedError) as e:
                if rnd == 0:
                    print(f"  {name:18s} skipped: {e}", flush=True)
                continue
            best = rows.get(name, (0.0, 0.0))
            rows[name] = (max(best[0], p), max(best[1], d))
            print(f"  {name:18s} prefill {p:8.1f} tok/s   decode {d:6.2f} tok/s", flush=True)
    if args.repeat > 1:
        print(f"best of {args.repeat}:")
        for name, (p, d) in rows.items():
            print(f"  {name:18s} prefill {p:8.1f} tok/s   decode {d:6.2f} tok/s")
    ours = rows["strata"]
    for name, (p, d) in rows.items():
        if name != "strata":
            print(f"  strata / {name:18s} prefill x{ours[0] / p:5.2f}   decode x{ours[1] / d:5.2f}")
    return rows


if __name__ == "__main__":
    main()
