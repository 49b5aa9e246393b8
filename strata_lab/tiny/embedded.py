"""The embedded tiny models the server, the demo and the sessions run on when given none."""
from __future__ import annotations

import os
from pathlib import Path

from strata_lab.tiny.registry import make_tiny

__all__ = ["EMBEDDED_KINDS", "embedded_model"]

EMBEDDED_KINDS = {"hybrid": "qwen3_next", "attention": "qwen3"}


def embedded_model(kind: str = "hybrid", *, seed: int = 0) -> Path:
    """The embedded tiny model the server, the demo and the sessions run on when given none: random
    weights in the real HF layout over the real Qwen3 tokenizer, generated once into the cache dir.

    ``kind`` is "hybrid" (Qwen3-Next: Gated DeltaNet + gated attention, the state that cannot roll back)
    or "attention" (Qwen3 dense). Its embedding has the tokenizer's 151669 rows rather than Qwen's padded
    151936: a random model samples every row it has, and the spare rows (which a trained model never
    emits) have no text, so they would show up as divergences that no real session has.

    Args:
        kind: "hybrid" or "attention".
        seed: the random weights' seed (each seed is its own folder).
    """
    if kind not in EMBEDDED_KINDS:
        raise ValueError(f"kind must be one of {sorted(EMBEDDED_KINDS)}, got {kind!r}")
    from strata_lab.text.tokenizer import TOKENIZER_SPECS, _cache_dir

    spec = TOKENIZER_SPECS["qwen3"]  # its size is known without loading it (start-up: issue 31)
    vocab = spec.first_added_id + len(spec.added_tokens)  # added tokens follow the ranks (build_tokenizer_json)
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
