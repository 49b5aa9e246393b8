"""Importers: the logs people already have (OpenAI/Anthropic bodies, OTel spans, Claude Code and Codex
sessions, HAR captures, vLLM/SGLang/llama.cpp server logs, ShareGPT) read into one `Trace` table, rendered to
strata-dump/1 lines with any tokenizer and chat template. See `load_trace`."""
from __future__ import annotations

__all__ = ["load_trace", "Trace", "READERS", "TraceWarning"]


def __getattr__(name: str):
    if name in ("load_trace", "Trace"):
        from strata_lab.traces import trace

        return getattr(trace, name)
    if name == "READERS":
        from strata_lab.traces.registry import READERS

        return READERS
    if name == "TraceWarning":
        from strata_lab.traces.source import TraceWarning

        return TraceWarning
    raise AttributeError(f"module 'strata_lab.traces' has no attribute {name!r}")
