"""Writing a random-weight model folder in the Hugging Face layout: safetensors files, config.json,
generation_config.json, tokenizer.json (the real Qwen3 vocabulary) and tokenizer_config.json (our chat template).

Only numpy is used for the weights: safetensors files are written here directly, which also covers bfloat16
(numpy has no bf16 type; we store the uint16 bit patterns, rounded to nearest even). Each architecture module
(`qwen3`, `qwen3_next`) decides the tensors and config; this module writes them.
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

__all__ = ["DTYPES", "to_bf16_bits", "write_safetensors", "write_weights", "write_folder_files",
           "special_token_ids", "is_int8_matrix", "quantize_rows_int8", "int8_quantization_config"]

# dtype name -> safetensors dtype tag (the float types a model folder is written in)
DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
# ... plus int8, for the matrices of an int8-stored folder (``weights="int8"``)
_TAGS = dict(DTYPES, int8="I8")
_SIZES = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1}


def to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even.

    >>> to_bf16_bits(np.array([1.0, -2.5], dtype=np.float32)).tolist()
    [16256, 49184]
    """
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)


def round_to(a: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values as stored in ``dtype`` and read back (what a loader computes with).

    >>> round_to(np.array([1.00390625], np.float32), "bfloat16").tolist()
    [1.0]
    """
    a = np.ascontiguousarray(a, dtype=np.float32)
    if dtype == "float16":
        return a.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        return (to_bf16_bits(a).astype(np.uint32) << np.uint32(16)).view(np.float32)
    return a


def is_int8_matrix(name: str, shape: tuple[int, ...]) -> bool:
    """Whether an int8-stored folder stores ``name`` as int8 rows plus ``<name>_scale``: exactly the
    matrices the engine computes with as int8 under ``weights="int8"`` (projections, the MoE router,
    an untied lm_head); embeddings, norms, conv and gate vectors stay in the float dtype.

    >>> is_int8_matrix("model.layers.0.self_attn.q_proj.weight", (8, 4)), is_int8_matrix("model.norm.weight", (4,))
    (True, False)
    """
    if len(shape) != 2 or name.startswith("mtp."):
        return False
    return name == "lm_head.weight" or name.endswith(("_proj.weight", ".in_proj_qkvz.weight", ".in_proj_ba.weight",
                                                      ".mlp.gate.weight"))


def quantize_rows_int8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-row int8: scale = absmax / 127 (1 for an all-zero row), q = round-half-even(w / scale)
    clipped to [-127, 127]; the engine's quantise-at-load (kernels::quantize_rows_int8) in float32, so a
    stored folder and ``Engine.load(path, weights="int8")`` of the same float weights hold the same bits.

    >>> q, s = quantize_rows_int8(np.array([[0.5, -1.0], [0.0, 0.0]], np.float32))
    >>> q.tolist(), s.tolist()
    ([[64, -127], [0, 0]], [0.007874015718698502, 1.0])
    """
    w = np.ascontiguousarray(w, dtype=np.float32)
    amax = np.max(np.abs(w), axis=1)
    ok = (amax > 0) & np.isfinite(amax)
    s = np.where(ok, amax / np.float32(127.0), np.float32(1.0)).astype(np.float32)
    q = np.clip(np.rint(w / s[:, None]), -127, 127).astype(np.int8)
    return q, s


def int8_quantization_config(ignore: list[str]) -> dict[str, Any]:
    """config.json ``quantization_config`` of an int8-stored folder, in compressed-tensors' terms
    (int-quantized, 8-bit symmetric int weights, one scale per output channel, no activation
    quantization). strata reads the tensors themselves (``<name>`` I8 + ``<name>_scale`` F32 [rows, 1])."""
    return {"quant_method": "compressed-tensors", "format": "int-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None,
                                          "weights": {"num_bits": 8, "type": "int", "symmetric": True,
                                                      "strategy": "channel", "group_size": None,
                                                      "dynamic": False}}},
            "ignore": ignore}


def _encode(a: np.ndarray, dtype: str) -> bytes:
    if dtype == "int8":
        return np.ascontiguousarray(a, dtype="<i1").tobytes()
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
        if dt not in _TAGS:
            raise ValueError(f"dtype must be one of {sorted(_TAGS)}, got {dt!r} for {name}")
        nbytes = int(np.prod(shape, dtype=np.int64)) * _SIZES[dt]
        header[name] = {"dtype": _TAGS[dt], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
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


def write_weights(path: Path, specs: Mapping[str, tuple[int, ...]], make: Callable[[str], np.ndarray], *,
                  dtype: str, shards: int = 1, int8: bool = False) -> None:
    """Write ``specs`` (name -> shape, in write order) as model.safetensors, or as ``shards`` files plus
    model.safetensors.index.json. ``make(name)`` returns the float32 data; it is called in spec order either
    way, so a seeded generator gives the same weights sharded or not.

    ``int8``: every matrix :func:`is_int8_matrix` selects is rounded to ``dtype`` (the values a float folder
    would hold), quantised per row (:func:`quantize_rows_int8`) and written as ``<name>`` I8 [rows, cols]
    followed by ``<name>_scale`` F32 [rows, 1]; the other tensors are written in ``dtype``."""
    typed: dict[str, tuple[str, tuple[int, ...]]] = {}
    for n, s in specs.items():
        if int8 and is_int8_matrix(n, tuple(s)):
            typed[n] = ("int8", tuple(s))
            typed[n + "_scale"] = ("float32", (int(s[0]), 1))
        else:
            typed[n] = (dtype, tuple(s))
    scales: dict[str, np.ndarray] = {}

    def produce(name: str) -> np.ndarray:
        if name in scales:  # a scale: written right after its matrix
            return scales.pop(name)[:, None]
        a = make(name)
        if typed[name][0] != "int8":
            return a
        q, s = quantize_rows_int8(round_to(a, dtype))
        scales[name + "_scale"] = s
        return q

    if shards == 1:  # streamed: spec order is write order
        write_safetensors(path / "model.safetensors", typed, produce, dtype=dtype)
        return
    drawn = {n: produce(n) for n in typed}
    names = list(typed)
    weight_map = {}
    for k in range(shards):
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        group = names[k::shards]
        write_safetensors(path / fname, {n: typed[n] for n in group}, drawn.__getitem__, dtype=dtype)
        weight_map.update({n: fname for n in group})
    index = {"metadata": {}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))


def special_token_ids() -> dict[str, int]:
    """Ids of the Qwen3 special tokens a model folder names, read from the real tokenizer.

    >>> special_token_ids()["eos"]
    151645
    """
    from strata_lab.text.tokenizer import load_tokenizer

    tok = load_tokenizer("qwen3")
    ids = {"bos": tok.token_id("<|endoftext|>"), "eos": tok.token_id("<|im_end|>")}
    return ids


def write_folder_files(path: Path, config: dict[str, Any], generation: dict[str, Any]) -> None:
    """config.json, generation_config.json (``generation`` plus the special ids), tokenizer.json and
    tokenizer_config.json next to the weights."""
    from strata_lab.text.template import ChatTemplate
    from strata_lab.text.tokenizer import load_tokenizer

    ids = special_token_ids()
    (path / "config.json").write_text(json.dumps(config, indent=1))
    (path / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": ids["bos"], "eos_token_id": [ids["eos"], ids["bos"]], **generation}, indent=1))
    load_tokenizer("qwen3").save(path / "tokenizer.json")
    template_config = ChatTemplate.from_name("qwen3").to_tokenizer_config()
    (path / "tokenizer_config.json").write_text(json.dumps(template_config, indent=1, ensure_ascii=False))
