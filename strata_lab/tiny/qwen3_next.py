"""Random-weight Qwen3-Next (``qwen3_next``) model folders in the exact Hugging Face layout.

``make_tiny(path, "qwen3_next", ...)`` dispatches here. Only numpy is used, so tests and benchmarks never
download weights. Tensor names and shapes follow docs/ENGINE.md; the layer pattern can be written either as ``layer_types`` or as ``full_attention_interval`` (both
spellings occur on the Hub), and ``mtp.*`` tensors (multi-token prediction) can be added to check that
loaders ignore them.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from strata_lab.tiny.writer import int8_quantization_config, special_token_ids, write_folder_files, write_weights

__all__ = ["NextShape", "NEXT_PRESETS", "config_dict", "write"]


@dataclass(frozen=True)
class NextShape:
    """Shape of a Qwen3-Next model (the config.json fields that matter for the math).

    >>> NextShape().layer_types()
    ['linear_attention', 'full_attention', 'linear_attention', 'full_attention']
    """

    vocab_size: int = 151936          # the real Qwen vocab: tokenizer.json ids all fit
    hidden_size: int = 64
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    intermediate_size: int = 96
    linear_num_key_heads: int = 2
    linear_num_value_heads: int = 4
    linear_key_head_dim: int = 16
    linear_value_head_dim: int = 16
    linear_conv_kernel_dim: int = 4
    full_attention_interval: int = 2
    partial_rotary_factor: float = 0.25
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    num_experts: int = 0
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 32
    shared_expert_intermediate_size: int = 48
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    tie_word_embeddings: bool = False

    def __post_init__(self) -> None:
        positive = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                    "num_key_value_heads", "head_dim", "intermediate_size", "linear_num_key_heads",
                    "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                    "linear_conv_kernel_dim", "full_attention_interval", "decoder_sparse_step"]
        for name in positive:
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_key_value_heads must divide num_attention_heads")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError("linear_num_key_heads must divide linear_num_value_heads")
        rd = int(self.head_dim * self.partial_rotary_factor)
        if not (0 < self.partial_rotary_factor <= 1) or rd % 2:
            raise ValueError(f"partial_rotary_factor gives an odd or empty rotary dim ({rd})")
        if self.num_experts < 0:
            raise ValueError("num_experts must be >= 0")
        if self.num_experts and not (0 < self.num_experts_per_tok <= self.num_experts):
            raise ValueError("num_experts_per_tok must be in 1..num_experts")

    def layer_types(self) -> list[str]:
        return ["full_attention" if (i + 1) % self.full_attention_interval == 0 else "linear_attention"
                for i in range(self.num_hidden_layers)]

    def is_moe(self, i: int) -> bool:
        return (i not in self.mlp_only_layers and self.num_experts > 0
                and (i + 1) % self.decoder_sparse_step == 0)


NEXT_PRESETS: dict[str, NextShape] = {
    "tiny": NextShape(),
    "tiny-moe": NextShape(num_experts=4, num_experts_per_tok=2, mlp_only_layers=(2,)),
    # A scaled-down Qwen3-Next-80B-A3B (same ratios: 3 GDN layers per attention layer, Hv = 2 Hk,
    # partial RoPE 0.25, top-10-of-many MoE with a shared expert) small enough to run on 2 cores.
    "bench": NextShape(vocab_size=151936, hidden_size=1024, num_hidden_layers=8, num_attention_heads=8,
                       num_key_value_heads=2, head_dim=128, intermediate_size=2048,
                       linear_num_key_heads=8, linear_num_value_heads=16, linear_key_head_dim=64,
                       linear_value_head_dim=64, full_attention_interval=4, rope_theta=1e7,
                       num_experts=16, num_experts_per_tok=4, moe_intermediate_size=256,
                       shared_expert_intermediate_size=512, tie_word_embeddings=True),
}


def _tensors(shape: NextShape, rng: np.random.Generator, std: float, mtp: bool) -> dict[str, np.ndarray]:
    s = shape
    D = s.hidden_size

    def w(*dims: int) -> np.ndarray:
        return (rng.standard_normal(dims, dtype=np.float32) * std).astype(np.float32)

    def norm(n: int) -> np.ndarray:  # Qwen3-Next (1+w) norms: small random w around 0
        return (rng.standard_normal(n, dtype=np.float32) * 0.1).astype(np.float32)

    def mlp(prefix: str, inner: int) -> dict[str, np.ndarray]:
        return {f"{prefix}.gate_proj.weight": w(inner, D), f"{prefix}.up_proj.weight": w(inner, D),
                f"{prefix}.down_proj.weight": w(D, inner)}

    Hk, Hv, dk, dv, K = (s.linear_num_key_heads, s.linear_num_value_heads, s.linear_key_head_dim,
                         s.linear_value_head_dim, s.linear_conv_kernel_dim)
    H, Hkv, hd = s.num_attention_heads, s.num_key_value_heads, s.head_dim
    out: dict[str, np.ndarray] = {"model.embed_tokens.weight": w(s.vocab_size, D) * 20}
    for i, kind in enumerate(s.layer_types()):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = norm(D)
        out[p + "post_attention_layernorm.weight"] = norm(D)
        if kind == "linear_attention":
            C = 2 * Hk * dk + Hv * dv
            out[p + "linear_attn.in_proj_qkvz.weight"] = w(2 * Hk * dk + 2 * Hv * dv, D)
            out[p + "linear_attn.in_proj_ba.weight"] = w(2 * Hv, D)
            out[p + "linear_attn.conv1d.weight"] = (rng.standard_normal((C, 1, K), dtype=np.float32)
                                                    * 0.5).astype(np.float32)
            out[p + "linear_attn.A_log"] = np.log(rng.uniform(0.5, 8.0, Hv)).astype(np.float32)
            out[p + "linear_attn.dt_bias"] = (rng.standard_normal(Hv) * 0.5).astype(np.float32)
            out[p + "linear_attn.norm.weight"] = (1.0 + rng.standard_normal(dv) * 0.1).astype(np.float32)
            out[p + "linear_attn.out_proj.weight"] = w(D, Hv * dv)
        else:
            out[p + "self_attn.q_proj.weight"] = w(2 * H * hd, D)
            out[p + "self_attn.k_proj.weight"] = w(Hkv * hd, D)
            out[p + "self_attn.v_proj.weight"] = w(Hkv * hd, D)
            out[p + "self_attn.o_proj.weight"] = w(D, H * hd)
            out[p + "self_attn.q_norm.weight"] = norm(hd)
            out[p + "self_attn.k_norm.weight"] = norm(hd)
        if s.is_moe(i):
            out[p + "mlp.gate.weight"] = w(s.num_experts, D) * 10
            for e in range(s.num_experts):
                out.update(mlp(f"{p}mlp.experts.{e}", s.moe_intermediate_size))
            out.update(mlp(f"{p}mlp.shared_expert", s.shared_expert_intermediate_size))
            out[p + "mlp.shared_expert_gate.weight"] = w(1, D)
        else:
            out.update(mlp(p + "mlp", s.intermediate_size))
    out["model.norm.weight"] = norm(D)
    if not s.tie_word_embeddings:
        out["lm_head.weight"] = w(s.vocab_size, D)
    if mtp:  # multi-token-prediction head as shipped on the Hub; loaders must ignore it
        out["mtp.fc.weight"] = w(D, 2 * D)
        out["mtp.norm.weight"] = norm(D)
        out["mtp.layers.0.input_layernorm.weight"] = norm(D)
    return out


def config_dict(shape: NextShape, *, pattern: str = "layer_types") -> dict:
    """config.json contents for ``shape``; ``pattern`` is "layer_types" or "full_attention_interval".

    >>> config_dict(NextShape(), pattern="full_attention_interval")["full_attention_interval"]
    2
    """
    if pattern not in ("layer_types", "full_attention_interval"):
        raise ValueError(f"pattern must be 'layer_types' or 'full_attention_interval', got {pattern!r}")
    d = asdict(shape)
    d["mlp_only_layers"] = list(shape.mlp_only_layers)
    interval = d.pop("full_attention_interval")
    if pattern == "layer_types":
        d["layer_types"] = shape.layer_types()
    else:
        d["full_attention_interval"] = interval
    d.update(architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next", hidden_act="silu",
             attention_bias=False, max_position_embeddings=32768, torch_dtype="float32")
    ids = special_token_ids()
    if shape.vocab_size > max(ids.values()):  # the real Qwen special ids only exist in a full-size vocab
        d.update(bos_token_id=ids["bos"], eos_token_id=ids["eos"])
    return d


def write(path: str | os.PathLike, shape: NextShape, *, seed: int = 0, dtype: str = "float32",
          shards: int = 1, pattern: str = "layer_types", mtp: bool = False, weights: str | None = None) -> Path:
    """Write a random ``qwen3_next`` model folder of ``shape``; ``pattern`` is how config.json spells the
    layer pattern ("layer_types" or "full_attention_interval"), ``mtp`` adds multi-token-prediction
    tensors that loaders must ignore, ``weights="int8"`` stores the projection, router and untied lm_head
    matrices as int8 rows with per-row scales (writer.write_weights).

    >>> import tempfile, json
    >>> from strata_lab.tiny import make_tiny
    >>> p = make_tiny(tempfile.mkdtemp(), "qwen3_next", "tiny-moe", overrides={"hidden_size": 32})
    >>> json.load(open(p / "config.json"))["model_type"], (p / "tokenizer.json").exists()
    ('qwen3_next', True)
    """
    if shards != 1:
        raise ValueError(f"shards must be 1 for qwen3_next model folders, got {shards}")
    cfg = config_dict(shape, pattern=pattern)
    rng = np.random.default_rng(seed)
    tensors = _tensors(shape, rng, 1.0 / np.sqrt(shape.hidden_size), mtp)
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    cfg["torch_dtype"] = dtype
    write_weights(out, {k: v.shape for k, v in tensors.items()}, tensors.__getitem__, dtype=dtype,
                  int8=weights == "int8")
    if weights == "int8":
        cfg["quantization_config"] = int8_quantization_config(
            (["lm_head"] if shape.tie_word_embeddings else []) + ["re:.*shared_expert_gate$", "re:^mtp\\..*"])
    write_folder_files(out, cfg, {"do_sample": False})
    return out
