"""Engine cache models: replay any trace under vLLM, SGLang, llama.cpp, TensorRT-LLM and hosted-API caching.

Each engine's prefix cache is a `CacheModel` with its parameters in a frozen, versioned preset (TOML shipped
in this package, overridable with "engine@version:key=value,..."); `replay_engines` runs a dump's calls
through several of them (ours, `strata`, among them) and returns one report (`ReplayReport`): one typed row per
(engine, call) and one summary per engine.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "CacheModel": "strata_lab.caches.base", "CachePlan": "strata_lab.caches.base", "Hint": "strata_lab.caches.base",
    "Call": "strata_lab.caches.call_ids", "calls_from_dump": "strata_lab.caches.call_ids",
    "parse_engine": "strata_lab.caches.presets", "preset": "strata_lab.caches.presets",
    "EnginePreset": "strata_lab.caches.presets", "ModelShape": "strata_lab.caches.presets",
    "replay_engines": "strata_lab.caches.replay",
    "ReplayReport": "strata_lab.caches.replay", "replay": "strata_lab.caches.replay",
    "lint_calls": "strata_lab.caches.lint", "fix_calls": "strata_lab.caches.lint",
    "sweep_budget": "strata_lab.caches.sweeps", "compare_engines": "strata_lab.caches.sweeps",
    "compare_policies": "strata_lab.caches.sweeps",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'strata_lab.caches' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
