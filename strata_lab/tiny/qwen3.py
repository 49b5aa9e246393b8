"""Random-weight Qwen3 dense (``qwen3``) model folders: shapes, presets, tensors and config.

>>> import tempfile
>>> from strata_lab.tiny import make_tiny
>>> path = make_tiny(tempfile.mkdtemp(), preset="tiny", dtype="bfloat16")
>>> sorted(p.name for p in path.iterdir())[:3]
['config.json', 'generation_config.json', 'model.safetensors']
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from strata_lab.tiny.writer import int8_quantization_config, special_token_ids, write_folder_files, write_weights

__all__ = ["Qwen3Shape", "QWEN3_PRESETS", "write"]


@dataclass(frozen=True)
class Qwen3Shape:
    """Sizes of a Qwen3 dense model (config.json fields)."""

    vocab_size: int = 151936
    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    intermediate_size: int = 128
    tie_word_embeddings: bool = True
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 40960

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "intermediate_size", "max_position_embeddings"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even, got {self.head_dim}")

    @classmethod
    def from_name(cls, name: str) -> "Qwen3Shape":
        if name not in QWEN3_PRESETS:
            raise ValueError(f"preset must be one of {sorted(QWEN3_PRESETS)}, got {name!r}")
        return QWEN3_PRESETS[name]


QWEN3_PRESETS = {
    "tiny": Qwen3Shape(),
    "tiny-untied": Qwen3Shape(tie_word_embeddings=False),
    "qwen3-0.6b": Qwen3Shape(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                             head_dim=128, intermediate_size=3072, tie_word_embeddings=True),
}


def _qwen3_specs(s: Qwen3Shape) -> Iterator[tuple[str, tuple[int, ...], str]]:
    """(name, shape, init) of every Qwen3 tensor; init is 'embed', 'norm' or 'linear'."""
    D, hd, I = s.hidden_size, s.head_dim, s.intermediate_size
    yield "model.embed_tokens.weight", (s.vocab_size, D), "embed"
    for i in range(s.num_hidden_layers):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (D,), "norm"
        yield p + "self_attn.q_proj.weight", (s.num_attention_heads * hd, D), "linear"
        yield p + "self_attn.k_proj.weight", (s.num_key_value_heads * hd, D), "linear"
        yield p + "self_attn.v_proj.weight", (s.num_key_value_heads * hd, D), "linear"
        yield p + "self_attn.o_proj.weight", (D, s.num_attention_heads * hd), "linear"
        yield p + "self_attn.q_norm.weight", (hd,), "norm"
        yield p + "self_attn.k_norm.weight", (hd,), "norm"
        yield p + "post_attention_layernorm.weight", (D,), "norm"
        yield p + "mlp.gate_proj.weight", (I, D), "linear"
        yield p + "mlp.up_proj.weight", (I, D), "linear"
        yield p + "mlp.down_proj.weight", (D, I), "linear"
    yield "model.norm.weight", (D,), "norm"
    if not s.tie_word_embeddings:
        yield "lm_head.weight", (s.vocab_size, D), "linear"


def _random_tensor(rng: np.random.Generator, shape: tuple[int, ...], init: str) -> np.ndarray:
    # Scales keep activations O(1) and logits spread over a few units, so sampling is not degenerate.
    if init == "norm":
        return (1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    scale = 0.25 if init == "embed" else 1.0 / np.sqrt(shape[-1])
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)


def _qwen3_config(s: Qwen3Shape, dtype: str) -> dict:
    ids = special_token_ids()
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        **{k: v for k, v in asdict(s).items()},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "rope_scaling": None,
        "use_cache": True,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": s.num_hidden_layers,
        "bos_token_id": ids["bos"],
        "eos_token_id": ids["eos"],
        "torch_dtype": dtype,
    }


def write(path: str | os.PathLike, shape: Qwen3Shape, *, seed: int = 0, dtype: str = "float32",
          shards: int = 1, weights: str | None = None) -> Path:
    """Write a random Qwen3 dense model folder of ``shape`` to ``path``; returns the directory.
    ``weights="int8"`` stores the projection matrices (and an untied lm_head) as int8 rows with per-row
    scales (writer.write_weights)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    specs = list(_qwen3_specs(shape))
    inits = {name: (s, init) for name, s, init in specs}
    write_weights(path, {n: s for n, s, _ in specs}, lambda name: _random_tensor(rng, *inits[name]),
                  dtype=dtype, shards=shards, int8=weights == "int8")
    config = _qwen3_config(shape, dtype)
    if weights == "int8":
        config["quantization_config"] = int8_quantization_config(["lm_head"] if shape.tie_word_embeddings else [])
    write_folder_files(path, config,
                       {"pad_token_id": special_token_ids()["bos"], "do_sample": True, "temperature": 0.6,
                        "top_k": 20, "top_p": 0.95})
    return path
