"""strata_lab: understand and fix prompt re-reading in LLM serving.

Importing the package is quick and has no side effects: every public name is loaded on first use. The one
exception is asked for: with `STRATA_PROMPT_DUMP` set, the import turns on recording every engine call of the
process to that file (`strata_lab.recording.start_env_recording`; the file opens on the first call).
"""
from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# public name -> module that defines it. Modules are imported on first attribute access.
_EXPORTS = {
    "Tokenizer": "strata_lab.text.tokenizer",
    "load_tokenizer": "strata_lab.text.tokenizer",
    "ChatTemplate": "strata_lab.text.template",
    "PromptEncoder": "strata_lab.text.encoder",
    "Engine": "strata_lab.engine",
    "Session": "strata_lab.engine",
    "Stream": "strata_lab.engine",
    "Sampling": "strata_lab.engine",
    "CheckpointPolicy": "strata_lab.rules",
    "TokenLogprob": "strata_lab.engine",
    "TokenGrammar": "strata_lab.grammar",
    "make_tiny": "strata_lab.tiny",
    "embedded_model": "strata_lab.tiny",
    "Recorder": "strata_lab.dump.writer",
    "record_to": "strata_lab.recording",
    "load_dump": "strata_lab.dump.reader",
    "example_dumps": "strata_lab.dump.examples",
    "Dump": "strata_lab.dump.reader",
    "replay": "strata_lab.caches.replay",   # ours, or engine="vllm" etc.: caches/replay.py
    "Store": "strata_lab.dump",
    "convert_jsonl": "strata_lab.dump",
    "StoreRecorder": "strata_lab.dump.writer",
    "replay_engines": "strata_lab.caches.replay",
    "parse_engine": "strata_lab.caches.presets",
    "load_trace": "strata_lab.traces.trace",
    "load_hash_trace": "strata_lab.traces.hashtrace",
    "sweep": "strata_lab.caches.capacity",
    "plot_sweep": "strata_lab.caches.capacity",
    "export_trace": "strata_lab.caches.export",
    "Trace": "strata_lab.traces.trace",
    "open_calls": "strata_lab.traces.opener",
    "CallRecord": "strata_lab.dump.record",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'strata_lab' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from strata_lab.dump.reader import Dump, load_dump
    from strata_lab.dump.examples import example_dumps
    from strata_lab.dump.writer import Recorder
    from strata_lab.recording import record_to
    from strata_lab.engine import Engine, Sampling, Session, Stream
    from strata_lab.rules import CheckpointPolicy
    from strata_lab.caches.replay import replay
    from strata_lab.caches.capacity import plot_sweep, sweep
    from strata_lab.caches.export import export_trace
    from strata_lab.traces.hashtrace import load_hash_trace
    from strata_lab.text.encoder import PromptEncoder
    from strata_lab.text.template import ChatTemplate
    from strata_lab.text.tokenizer import Tokenizer, load_tokenizer
    from strata_lab.dump import Store, convert_jsonl
    from strata_lab.dump.writer import StoreRecorder
    from strata_lab.caches.presets import parse_engine
    from strata_lab.caches.replay import replay_engines
    from strata_lab.engine import TokenLogprob
    from strata_lab.grammar import TokenGrammar
    from strata_lab.tiny import embedded_model, make_tiny
    from strata_lab.traces.trace import Trace, load_trace
    from strata_lab.traces.opener import open_calls
    from strata_lab.dump.record import CallRecord


if os.environ.get("STRATA_PROMPT_DUMP"):  # recording is an observer attached above the engine
    importlib.import_module("strata_lab.recording").start_env_recording()
