"""Random-weight model folders in the real Hugging Face layout, for tests, benchmarks and the demo.

A *model folder* (config.json, safetensors weights, tokenizer files) is what `Engine.load` reads; we never
call it a checkpoint, which in strata_lab means a snapshot of a session's state.

>>> import tempfile
>>> path = make_tiny(tempfile.mkdtemp(), "qwen3", "tiny", overrides={"num_hidden_layers": 1})
>>> (path / "model.safetensors").is_file()
True
"""
from __future__ import annotations

from strata_lab.tiny.embedded import EMBEDDED_KINDS, embedded_model
from strata_lab.tiny.qwen3 import QWEN3_PRESETS, Qwen3Shape
from strata_lab.tiny.qwen3_next import NEXT_PRESETS, NextShape
from strata_lab.tiny.registry import ARCHS, make_tiny
from strata_lab.tiny.writer import DTYPES, to_bf16_bits, write_safetensors

__all__ = ["make_tiny", "embedded_model", "EMBEDDED_KINDS", "ARCHS", "Qwen3Shape", "QWEN3_PRESETS", "NextShape",
           "NEXT_PRESETS", "DTYPES", "to_bf16_bits", "write_safetensors"]
