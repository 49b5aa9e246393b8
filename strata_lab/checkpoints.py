"""Random-weight checkpoints in the real Hugging Face layout, for tests and benchmarks.

``make_tiny`` writes config.json, model.safetensors (or shards plus model.safetensors.index.json),
generation_config.json, tokenizer.json (the real Qwen3 vocab) and tokenizer_config.json (our chat
template). Only numpy is used for the weights: the safetensors files are written here directly, which
also covers bfloat16 (numpy has no bf16 type; we store the uint16 bit patterns, rounded to nearest even).

>>> import tempfile
>>> path = make_tiny(tempfile.mkdtemp(), preset="tiny", dtype="bfloat16")
>>> sorted(p.name for p in path.iterdir())[:3]
['config.json', 'generation_config.json', 'model.safetensors']
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np

__all__ = ["make_tiny", "Qwen3Shape", "QWEN3_PRESETS", "write_safetensors", "to_bf16_bits", "DTYPES"]

# dtype name -> safetensors dtype tag
DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
QWEN3_BOS, QWEN3_IM_END, QWEN3_EOT = 151643, 151645, 151643


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


def to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even.

    >>> to_bf16_bits(np.array([1.0, -2.5], dtype=np.float32)).tolist()
    [16256, 49184]
    """
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)


def _encode(a: np.ndarray, dtype: str) -> bytes:
    if dtype == "float32":
        return np.ascontiguousarray(a, dtype="<f4").tobytes()
    if dtype == "float16":
        return np.ascontiguousarray(a, dtype="<f2").tobytes()
    return to_bf16_bits(a).astype("<u2").tobytes()


def write_safetensors(path: str | os.PathLike, specs: Mapping[str, tuple[str, tuple[int, ...]]],
                      tensors: Callable[[str], np.ndarray], *, dtype: str = "float32") -> None:
    """Write a safetensors file: ``specs`` maps name -> (dtype, shape); ``tensors(name)`` makes the float32 data.

    Tensors are produced and written one at a time, so multi-GB checkpoints never sit in memory at once.

    >>> import tempfile, safetensors.numpy
    >>> p = os.path.join(tempfile.mkdtemp(), "x.safetensors")
    >>> write_safetensors(p, {"w": ("float32", (2,))}, lambda n: np.ones(2, np.float32))
    >>> safetensors.numpy.load_file(p)["w"].tolist()
    [1.0, 1.0]
    """
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dt, shape) in specs.items():
        if dt not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dt!r} for {name}")
        nbytes = int(np.prod(shape, dtype=np.int64)) * (4 if dt == "float32" else 2)
        header[name] = {"dtype": DTYPES[dt], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name, (dt, shape) in specs.items():
            a = tensors(name)
            if tuple(a.shape) != tuple(shape):
                raise ValueError(f"tensor {name} has shape {a.shape}, expected {shape}")
            f.write(_encode(a, dt))


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
        "bos_token_id": QWEN3_BOS,
        "eos_token_id": QWEN3_IM_END,
        "torch_dtype": dtype,
    }


def _write_weights(path: Path, specs: list[tuple[str, tuple[int, ...], str]], dtype: str, seed: int,
                   shards: int) -> None:
    rng = np.random.default_rng(seed)
    inits = {name: (shape, init) for name, shape, init in specs}
    if shards == 1:  # streamed: spec order is write order
        write_safetensors(path / "model.safetensors", {n: (dtype, s) for n, s, _ in specs},
                          lambda name: _random_tensor(rng, *inits[name]), dtype=dtype)
        return
    drawn = {n: _random_tensor(rng, s, i) for n, s, i in specs}  # spec order: the same weights as unsharded
    weight_map = {}
    for k in range(shards):
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        group = specs[k::shards]
        write_safetensors(path / fname, {n: (dtype, s) for n, s, _ in group}, drawn.__getitem__, dtype=dtype)
        weight_map.update({n: fname for n, _, _ in group})
    index = {"metadata": {}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))


def _write_tokenizer(path: Path) -> None:
    from .tokenizer import load_tokenizer

    load_tokenizer("qwen3").save(path / "tokenizer.json")
    try:
        from .template import ChatTemplate
    except ImportError:  # the template module is optional at this layer
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "chat_template": _CHATML,
            "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
            "add_bos_token": False, "clean_up_tokenization_spaces": False, "model_max_length": 131072,
        }
    else:
        config = ChatTemplate.from_name("qwen3").to_tokenizer_config()
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=1, ensure_ascii=False))


_CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def make_qwen3(path: str | os.PathLike, *, shape: Qwen3Shape, seed: int = 0, dtype: str = "float32",
               shards: int = 1) -> Path:
    """Write a random Qwen3 dense checkpoint of ``shape`` to ``path``; returns the directory."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    _write_weights(path, list(_qwen3_specs(shape)), dtype, seed, shards)
    (path / "config.json").write_text(json.dumps(_qwen3_config(shape, dtype), indent=1))
    (path / "generation_config.json").write_text(json.dumps({
        "bos_token_id": QWEN3_BOS, "eos_token_id": [QWEN3_IM_END, QWEN3_EOT], "pad_token_id": QWEN3_EOT,
        "do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95}, indent=1))
    _write_tokenizer(path)
    return path


# arch -> (writer, presets). A new architecture (e.g. "qwen3_next") adds its own writer and presets.
_ARCHS: dict[str, tuple[Callable[..., Path], Mapping[str, Any]]] = {"qwen3": (make_qwen3, QWEN3_PRESETS)}


def _make_next(path: str | os.PathLike, *, shape, seed: int = 0, dtype: str = "float32", shards: int = 1) -> Path:
    from strata_lab._tiny_next import write_next

    return write_next(path, shape=shape, seed=seed, dtype=dtype, shards=shards)


def _next_presets() -> Mapping[str, Any]:
    from strata_lab._tiny_next import NEXT_PRESETS

    return NEXT_PRESETS


_ARCHS["qwen3_next"] = (_make_next, _next_presets())


def make_tiny(path: str | os.PathLike, arch: str = "qwen3", preset: str = "tiny", seed: int = 0,
              dtype: str = "float32", *, shards: int = 1, overrides: Mapping[str, Any] | None = None) -> Path:
    """Write a random-weight checkpoint directory in the Hugging Face layout and return its path.

    ``preset`` names a shape (``"tiny"``: hidden 64, 2 layers, real 151936-row embedding;
    ``"qwen3-0.6b"`` for benchmarks); ``overrides`` replaces shape fields; ``dtype`` is the stored
    weight type (float32, bfloat16, float16); ``shards`` > 1 writes a sharded index.

    >>> import tempfile
    >>> p = make_tiny(tempfile.mkdtemp(), overrides={"num_hidden_layers": 1})
    >>> json.loads((p / "config.json").read_text())["num_hidden_layers"]
    1
    """
    if arch not in _ARCHS:
        raise ValueError(f"arch must be one of {sorted(_ARCHS)}, got {arch!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if int(shards) < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    writer, presets = _ARCHS[arch]
    if preset not in presets:
        raise ValueError(f"preset must be one of {sorted(presets)} for arch {arch!r}, got {preset!r}")
    shape = presets[preset]
    if overrides:
        shape = replace(shape, **dict(overrides))
    return writer(path, shape=shape, seed=seed, dtype=dtype, shards=int(shards))


EMBEDDED_KINDS = {"hybrid": "qwen3_next", "attention": "qwen3"}


def embedded_model(kind: str = "hybrid", *, seed: int = 0) -> Path:
    """The embedded tiny model the server, the demo and the sessions run on when given none: random
    weights in the real HF layout over the real Qwen3 tokenizer, generated once into the cache dir.

    ``kind`` is "hybrid" (Qwen3-Next: Gated DeltaNet + gated attention, the state that cannot roll back)
    or "attention" (Qwen3 dense). Its embedding has the tokenizer's 151669 rows rather than Qwen's padded
    151936: a random model samples every row it has, and the spare rows (which a trained model never
    emits) have no text, so they would show up as divergences that no real session has.
    """
    if kind not in EMBEDDED_KINDS:
        raise ValueError(f"kind must be one of {sorted(EMBEDDED_KINDS)}, got {kind!r}")
    from .tokenizer import _cache_dir, load_tokenizer

    vocab = load_tokenizer("qwen3").vocab_size
    path = _cache_dir() / "models" / f"embedded-{kind}-vocab{vocab}-seed{seed}"
    if not (path / "config.json").is_file():
        import shutil

        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        make_tiny(tmp, arch=EMBEDDED_KINDS[kind], seed=seed, overrides={"vocab_size": vocab})
        try:
            os.replace(tmp, path)
        except OSError:  # another process made it first
            shutil.rmtree(tmp, ignore_errors=True)
    return path
