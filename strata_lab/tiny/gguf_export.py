"""GGUF files of a model folder, for running the same weights in llama.cpp (the benchmarks' peer and the
writer's own test). Uses the ``gguf`` package (imported on use); reading the files needs llama.cpp
(llama-cpp-python), which is not a project dependency.

``write_gguf(folder, out, qtype)`` writes a ``qwen3`` GGUF of a Qwen3ForCausalLM folder or a ``qwen3next``
GGUF of a Qwen3NextForCausalLM folder: matrices in ``qtype`` ("f32", "f16" or "q8_0", quantised by the gguf
package), 1-D tensors, the conv kernels and the routers in f32, the real Qwen vocab. The transformations
follow llama.cpp's convert_hf_to_gguf.py (Qwen3Model, Qwen3NextModel) and the tensor shapes its qwen3next
loader asks for; tests/test_gguf_export.py checks llama.cpp's logits against the engine's.

qwen3next, from the Hugging Face layout (docs/ENGINE.md "GDN layer"):

- the (1 + w) norms (input/post-attention, final, q_norm, k_norm) are written as 1 + w, since llama.cpp's
  RMSNorm multiplies by the stored weight; the GDN gated norm (plain w) is written as is;
- ``A_log`` becomes ``ssm_a`` = -exp(A_log); ``dt_bias`` becomes ``ssm_dt.bias``;
- ``conv1d.weight`` [C, 1, K] is squeezed to [C, K];
- ``in_proj_qkvz`` (grouped per key head: q, k, v, z of each) becomes ``attn_qkv`` (all q, all k, all v: the
  conv channel order) and ``attn_gate`` (all z); ``in_proj_ba`` stays grouped (``ssm_ba``): llama.cpp
  splits it per key head itself;
- experts are stacked into ``ffn_{gate,up,down}_exps`` [E, rows, cols]; ``shared_expert_gate`` is
  ``ffn_gate_inp_shexp``;
- metadata: ssm conv kernel, state size (dk), group count (Hk), time-step rank (Hv), inner size (Hv*dv),
  full_attention_interval, expert counts and sizes, rope dimension count = head_dim * partial_rotary_factor.

llama.cpp's qwen3next loader takes only folders whose every layer is MoE and whose dk == dv; other folders
raise ValueError here rather than a load error there.
"""
from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path
from typing import Any, Iterator

import numpy as np

__all__ = ["read_safetensors", "split_qkvz", "write_gguf", "gguf_file"]

QTYPES = ("f32", "f16", "q8_0")


def read_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every tensor of a (single-file or sharded) safetensors model folder as float32 (bf16/f16/f32 stored).

    >>> import tempfile
    >>> from strata_lab.tiny import make_tiny
    >>> st = read_safetensors(make_tiny(tempfile.mkdtemp(), dtype="bfloat16", overrides={"num_hidden_layers": 1}))
    >>> st["model.norm.weight"].dtype, st["model.embed_tokens.weight"].shape
    (dtype('float32'), (151936, 64))
    """
    out = {}
    for f in sorted(Path(path).glob("*.safetensors")):
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


def split_qkvz(w: np.ndarray, hk: int, dk: int, hv: int, dv: int) -> tuple[np.ndarray, np.ndarray]:
    """``in_proj_qkvz`` rows grouped per key head ([q_g, k_g, v_g, z_g] for g < hk, v_g and z_g holding
    hv/hk value heads) -> (qkv rows: every q, every k, every v, in head order; z rows, in head order).

    >>> w = np.arange(2 * (1 + 1 + 2 + 2))[:, None]  # hk=2, dk=1, hv=4, dv=1: rows q0 k0 v0 v1 z0 z1 q1 ...
    >>> qkv, z = split_qkvz(w, hk=2, dk=1, hv=4, dv=1)
    >>> qkv[:, 0].tolist(), z[:, 0].tolist()
    ([0, 6, 1, 7, 2, 3, 8, 9], [4, 5, 10, 11])
    """
    r = hv // hk
    g = w.reshape(hk, 2 * dk + 2 * r * dv, -1)
    q, k, v, z = np.split(g, [dk, 2 * dk, 2 * dk + r * dv], axis=1)
    cols = w.shape[-1]
    return (np.concatenate([q.reshape(-1, cols), k.reshape(-1, cols), v.reshape(-1, cols)]),
            z.reshape(-1, cols))


@functools.lru_cache(maxsize=2)
def _vocab(gguf: Any, V: int) -> tuple[list[str], list[Any], list[str]]:
    """The real Qwen vocab as llama.cpp's converter writes it (gpt2 BPE): tokens, token types NORMAL / CONTROL
    (special added tokens) / USER_DEFINED / UNUSED ([PADn] rows past the tokenizer's vocab), merges."""
    from strata_lab.text.tokenizer import load_tokenizer

    tj = json.loads(load_tokenizer("qwen3").hf.to_str())
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
    return tokens, types, merges


def _header(gguf: Any, w: Any, cfg: dict, name: str, qtype: str) -> None:
    """The keys both architectures share: sizes, attention, norms, file type, tokenizer."""
    from strata_lab.text.tokenizer import load_tokenizer

    w.add_name("strata random " + name)
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
    w.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                     "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[qtype])
    tokens, types, merges = _vocab(gguf, int(cfg["vocab_size"]))  # cached: ~2 s for the real vocab
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    if "bos_token_id" in cfg:
        w.add_bos_token_id(int(cfg["bos_token_id"]))
        w.add_eos_token_id(int(cfg["eos_token_id"]))
    w.add_pad_token_id(load_tokenizer("qwen3").token_id("<|endoftext|>"))
    w.add_add_bos_token(False)


def _next_header(w: Any, cfg: dict) -> None:
    """qwen3next's own keys (llama.cpp's Qwen3NextModel.set_gguf_parameters and its loader)."""
    if not cfg.get("num_experts"):
        raise ValueError("llama.cpp's qwen3next loader needs MoE layers (num_experts > 0)")
    if cfg.get("mlp_only_layers") or int(cfg.get("decoder_sparse_step", 1)) != 1:
        raise ValueError("llama.cpp's qwen3next loader needs every layer to be MoE "
                         "(mlp_only_layers empty, decoder_sparse_step 1)")
    if cfg["linear_key_head_dim"] != cfg["linear_value_head_dim"]:
        raise ValueError("llama.cpp's qwen3next loader needs linear_key_head_dim == linear_value_head_dim")
    types = cfg.get("layer_types")
    interval = int(cfg.get("full_attention_interval", 4))
    if types is not None:
        interval = types.index("full_attention") + 1 if "full_attention" in types else len(types) + 1
        if types != ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                     for i in range(len(types))]:
            raise ValueError(f"layer_types is not every {interval}th layer full attention: {types}")
    w.add_expert_count(int(cfg["num_experts"]))
    w.add_expert_used_count(int(cfg["num_experts_per_tok"]))
    w.add_expert_feed_forward_length(int(cfg["moe_intermediate_size"]))
    w.add_expert_shared_feed_forward_length(int(cfg["shared_expert_intermediate_size"]))
    w.add_ssm_conv_kernel(int(cfg["linear_conv_kernel_dim"]))
    w.add_ssm_state_size(int(cfg["linear_key_head_dim"]))
    w.add_ssm_group_count(int(cfg["linear_num_key_heads"]))
    w.add_ssm_time_step_rank(int(cfg["linear_num_value_heads"]))
    w.add_ssm_inner_size(int(cfg["linear_value_head_dim"]) * int(cfg["linear_num_value_heads"]))
    w.add_full_attention_interval(interval)
    w.add_rope_dimension_count(int(int(cfg["head_dim"]) * float(cfg.get("partial_rotary_factor", 0.25))))


_EXPERT = re.compile(r"(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(\w+)\.weight")


def _next_tensors(st: dict[str, np.ndarray], cfg: dict) -> Iterator[tuple[str, np.ndarray]]:
    """(Hugging Face name after renaming, array) for a qwen3next GGUF; the name goes through gguf's
    TensorNameMap. attn_qkv / attn_gate come out already in GGUF names (no HF name maps to them)."""
    hk, hv = int(cfg["linear_num_key_heads"]), int(cfg["linear_num_value_heads"])
    dk, dv = int(cfg["linear_key_head_dim"]), int(cfg["linear_value_head_dim"])
    experts: dict[str, dict[int, np.ndarray]] = {}
    for name, a in st.items():
        if name.startswith("mtp."):  # multi-token prediction head: llama.cpp's converter drops it too
            continue
        if m := _EXPERT.fullmatch(name):
            experts.setdefault(f"{m.group(1)}.{m.group(3)}.weight", {})[int(m.group(2))] = a
            continue
        if name.endswith(".A_log"):
            yield name, -np.exp(a)
        elif name.endswith(".dt_bias"):
            yield name.removesuffix(".dt_bias") + ".dt_proj.bias", a
        elif name.endswith(".conv1d.weight"):
            yield name, a.reshape(a.shape[0], a.shape[-1])
        elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
            yield name, 1.0 + a
        elif name.endswith(".in_proj_qkvz.weight"):
            bid = int(name.split(".")[2])
            qkv, z = split_qkvz(a, hk, dk, hv, dv)
            yield f"blk.{bid}.attn_qkv.weight", qkv
            yield f"blk.{bid}.attn_gate.weight", z
        else:
            yield name, a
    for name, per in experts.items():
        yield name, np.stack([per[e] for e in range(len(per))])


def write_gguf(path: str | os.PathLike, out: str | os.PathLike, qtype: str = "f16") -> Path:
    """Write the model folder at ``path`` (qwen3 or qwen3_next) as a llama.cpp GGUF at ``out``."""
    import gguf

    if qtype not in QTYPES:
        raise ValueError(f"qtype must be one of {QTYPES}, got {qtype!r}")
    path, out = Path(path), Path(out)
    cfg = json.loads((path / "config.json").read_text())
    if "quantization_config" in cfg:
        raise ValueError(f"{path}: int8-stored folders are not written as GGUF (write the float folder)")
    kind = cfg.get("model_type")
    arch = {"qwen3": gguf.MODEL_ARCH.QWEN3, "qwen3_next": gguf.MODEL_ARCH.QWEN3NEXT}.get(kind)
    if arch is None:
        raise ValueError(f"{path}: model_type {kind!r} has no GGUF writer (qwen3, qwen3_next)")
    w = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[arch])
    try:
        _header(gguf, w, cfg, path.name, qtype)
        st = read_safetensors(path)
        if arch == gguf.MODEL_ARCH.QWEN3NEXT:
            _next_header(w, cfg)
            tensors: Iterator[tuple[str, np.ndarray]] = _next_tensors(st, cfg)
        else:
            tensors = iter(st.items())
        tmap = gguf.get_tensor_name_map(arch, int(cfg["num_hidden_layers"]))
        for name, arr in tensors:
            gname = name if name.startswith("blk.") else tmap.get_name(name, try_suffixes=(".weight", ".bias"))
            if gname is None:
                raise ValueError(f"no GGUF name for tensor {name}")
            # f32: 1-D tensors, the conv kernels and the routers (as llama.cpp's converter keeps them)
            if arr.ndim == 1 or gname.endswith(("ssm_conv1d.weight", "ffn_gate_inp.weight",
                                                "ffn_gate_inp_shexp.weight")) or qtype == "f32":
                w.add_tensor(gname, np.ascontiguousarray(arr, dtype=np.float32))
            elif qtype == "q8_0":
                q = gguf.quants.quantize(arr.astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
                w.add_tensor(gname, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            else:
                w.add_tensor(gname, arr.astype(np.float16))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()
    return out


def gguf_file(path: str | os.PathLike, qtype: str = "f16") -> Path:
    """The GGUF of the folder at ``path`` beside it (``<folder>-<qtype>.gguf``), written on first use."""
    path = Path(path)
    out = path.parent / f"{path.name}-{qtype}.gguf"
    if not out.exists():
        print(f"writing {out} ...", flush=True)
        tmp = out.with_suffix(".tmp")
        write_gguf(path, tmp, qtype)
        tmp.rename(out)
    return out
