"""One entry point for random-weight model folders: ``make_tiny(path, arch, preset, ...)``.

Each architecture registers its writer and its presets here; ``make_tiny`` validates the arguments, picks
the shape and forwards architecture options (``pattern``, ``mtp`` for qwen3_next).
"""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping

from strata_lab.tiny import qwen3, qwen3_next
from strata_lab.tiny.writer import DTYPES

__all__ = ["ARCHS", "make_tiny"]

# arch -> (writer, presets, the writer's extra options)
ARCHS: dict[str, tuple[Callable[..., Path], Mapping[str, Any], frozenset[str]]] = {
    "qwen3": (qwen3.write, qwen3.QWEN3_PRESETS, frozenset()),
    "qwen3_next": (qwen3_next.write, qwen3_next.NEXT_PRESETS, frozenset({"pattern", "mtp"})),
}


def make_tiny(path: str | os.PathLike, arch: str = "qwen3", preset: str = "tiny", seed: int = 0,
              dtype: str = "float32", *, shards: int = 1, overrides: Mapping[str, Any] | None = None,
              weights: str | None = None, **options: Any) -> Path:
    """Write a random-weight model folder in the Hugging Face layout and return its path.

    ``preset`` names a shape (``"tiny"``: hidden 64, 2 layers, real 151936-row embedding;
    ``"qwen3-0.6b"`` for benchmarks); ``overrides`` replaces shape fields; ``dtype`` is the stored
    weight type (float32, bfloat16, float16); ``shards`` > 1 writes a sharded index; ``options`` are the
    architecture's own (qwen3_next: ``pattern``, ``mtp``). ``weights="int8"`` writes an int8-stored folder
    (docs/ENGINE.md "int8 model folders"): the matrices the engine quantises under ``weights="int8"`` as I8
    ``<name>`` plus F32 ``<name>_scale`` [rows, 1], quantised from their ``dtype`` values exactly as the
    engine's quantise-at-load does; the other tensors in ``dtype``.

    Args:
        path: the folder to write.
        arch: the architecture ("qwen3", "qwen3_next").
        preset, overrides, dtype, shards, options: the shape and storage, as above.
        seed: the random weights' seed.
        weights: None (``dtype`` weights) or "int8".

    >>> import json, tempfile
    >>> p = make_tiny(tempfile.mkdtemp(), overrides={"num_hidden_layers": 1})
    >>> json.loads((p / "config.json").read_text())["num_hidden_layers"]
    1
    """
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {sorted(ARCHS)}, got {arch!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if weights not in (None, "stored", "int8"):
        raise ValueError(f"weights must be None, 'stored' or 'int8', got {weights!r}")
    if int(shards) < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    writer, presets, known = ARCHS[arch]
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"make_tiny got options {unknown} that arch {arch!r} does not take (it takes {sorted(known)})")
    if preset not in presets:
        raise ValueError(f"preset must be one of {sorted(presets)} for arch {arch!r}, got {preset!r}")
    shape = presets[preset]
    if overrides:
        shape = replace(shape, **dict(overrides))
    if weights == "int8":
        options["weights"] = "int8"
    return writer(path, shape, seed=seed, dtype=dtype, shards=int(shards), **options)


