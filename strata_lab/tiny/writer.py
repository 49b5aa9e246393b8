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
           "special_token_ids"]

# dtype name -> safetensors dtype tag
DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


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


def write_weights(path: Path, specs: Mapping[str, tuple[int, ...]], make: Callable[[str], np.ndarray], *,
                  dtype: str, shards: int = 1) -> None:
    """Write ``specs`` (name -> shape, in write order) as model.safetensors, or as ``shards`` files plus
    model.safetensors.index.json. ``make(name)`` returns the float32 data; it is called in spec order either
    way, so a seeded generator gives the same weights sharded or not."""
    if shards == 1:  # streamed: spec order is write order
        write_safetensors(path / "model.safetensors", {n: (dtype, s) for n, s in specs.items()}, make,
                          dtype=dtype)
        return
    drawn = {n: make(n) for n in specs}
    names = list(specs)
    weight_map = {}
    for k in range(shards):
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        group = names[k::shards]
        write_safetensors(path / fname, {n: (dtype, specs[n]) for n in group}, drawn.__getitem__, dtype=dtype)
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
