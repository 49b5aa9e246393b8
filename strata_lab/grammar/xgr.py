"""xgrammar over the Qwen3 vocabulary: compile JSON schemas, GBNF grammars and tool-call syntax; mask.

Chosen over llguidance by `benchmarks/grammar.py` (compile time per schema and mask time per token on
our vocabulary). The vocabulary is handed over as raw bytes per id (`VocabType.RAW`); added tokens
(`<|im_end|>`, `<think>`, `<tool_call>`, ...) and spare embedding rows get no text, so a grammar can only
spell tags byte by byte and never produces a stop id inside a string; once the grammar is complete only
the stop ids (`<|im_end|>`, `<|endoftext|>`) are allowed.

The mask runs on the engine's decode thread: `Session.generate(..., token_mask=grammar.mask())` calls
it before each sampled step with the id produced last; it advances the matcher and fills the bitmask
the C++ loop applies to a copy of the logits before sampling.

>>> from strata_lab import load_tokenizer
>>> g = TokenGrammar(load_tokenizer("qwen3"), 151669)  # doctest: +SKIP
>>> mask = g.json_schema({"type": "object"}).mask()  # doctest: +SKIP
"""
from __future__ import annotations

import json
import threading
from typing import Any, Sequence

import numpy as np

__all__ = ["TokenGrammar", "CompiledGrammar", "GrammarMask", "GrammarError", "bound_schema"]


def bound_schema(schema: Any, max_string: int | None, max_items: int | None) -> Any:
    """A copy of `schema` whose unbounded strings and arrays get maxLength / maxItems, so a generation
    under it always ends (a random-weight model otherwise writes one string until the token limit).
    Anything it accepts the original accepts too. None: leave that kind unbounded.

    >>> bound_schema({"type": "object", "properties": {"a": {"type": "string"}}}, 8, None)
    {'type': 'object', 'properties': {'a': {'type': 'string', 'maxLength': 8}}}
    >>> bound_schema({"type": "array", "minItems": 5}, None, 3)["maxItems"]
    5
    """
    if isinstance(schema, list):
        return [bound_schema(x, max_string, max_items) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (v if k in ("enum", "const", "default", "examples") else bound_schema(v, max_string, max_items))
           for k, v in schema.items()}
    kinds = out.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    free = not any(k in out for k in ("enum", "const", "pattern", "format"))
    if max_string is not None and "string" in kinds and free and "maxLength" not in out:
        out["maxLength"] = max(int(out.get("minLength", 0)), max_string)
    if max_string is not None and "object" in kinds and "properties" not in out and "additionalProperties" not in out:
        # a free object ({"type": "object"}, json_object): bounded scalar values
        out["additionalProperties"] = {"type": ["string", "number", "boolean", "null"], "maxLength": max_string}
        out.setdefault("propertyNames", {"maxLength": max_string})
    if max_items is not None and "array" in kinds and "maxItems" not in out:
        out["maxItems"] = max(int(out.get("minItems", 0)), max_items)
    return out


_DATA_KEYS = ("enum", "const", "default", "examples")


def rebase_refs(schema: Any, pointer: str) -> Any:
    """A copy of `schema` whose local references (`#`, `#/...`) point into it after it is placed at JSON
    pointer `pointer` of a larger schema (a tool's parameters inside the tool-call wrapper).

    >>> rebase_refs({"items": {"$ref": "#"}, "$defs": {"a": {"$ref": "#/$defs/b"}}}, "/properties/arguments")
    {'items': {'$ref': '#/properties/arguments'}, '$defs': {'a': {'$ref': '#/properties/arguments/$defs/b'}}}
    """
    if isinstance(schema, list):
        return [rebase_refs(x, pointer) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k, v in schema.items():
        if k == "$ref" and isinstance(v, str) and v.startswith("#"):
            out[k] = "#" + pointer + v[1:]
        else:
            out[k] = v if k in _DATA_KEYS else rebase_refs(v, pointer)
    return out


# xgrammar writes a string with maxLength (every free string here, via bound_schema) as characters of
# [^"\\\r\n]: raw control characters such as a tab pass, which JSON forbids (json.loads rejects the text).
# The class JSON allows there (no escapes: they would count as several characters) is [^\0-\x1f"\\].
_LOOSE_CHARS = '[^\\"\\\\\\r\\n]'
_JSON_CHARS = '[^\\0-\\x1f\\"\\\\]'


def json_schema_grammar(text: str) -> Any:
    """xgrammar's grammar for the JSON schema `text` (compact whitespace), its bounded strings kept to JSON's
    characters.

    >>> import xgrammar as xgr
    >>> g = json_schema_grammar('{"type": "string", "maxLength": 8}')
    >>> [xgr.testing._is_grammar_accept_string(g, s) for s in ('"ab"', '"a\\tb"')]
    [True, False]
    """
    import xgrammar as xgr

    grammar = xgr.Grammar.from_json_schema(text, any_whitespace=False, strict_mode=True)
    ebnf = str(grammar)
    return xgr.Grammar.from_ebnf(ebnf.replace(_LOOSE_CHARS, _JSON_CHARS)) if _LOOSE_CHARS in ebnf else grammar


def choice_ebnf(options: Sequence[str]) -> str:
    """An EBNF grammar whose language is exactly `options`.

    >>> choice_ebnf(["yes", "no"])
    'root ::= "yes" | "no"'
    """
    return "root ::= " + " | ".join(json.dumps(o, ensure_ascii=False) for o in options)


class GrammarError(ValueError):
    """A schema or grammar xgrammar cannot compile."""


class GrammarMask:
    """The engine's per-step mask for one generation: `mask(n_produced, last_id, bits) -> True`."""

    def __init__(self, compiled, vocab_size: int, stop_ids: Sequence[int] = ()):
        import xgrammar as xgr

        self._matcher = xgr.GrammarMatcher(compiled)
        self.mask_words = (vocab_size + 31) // 32
        self.stop_ids = tuple(stop_ids)
        self.rejected = 0  # ids the matcher refused (forced ids; never a sampled one)

    def __call__(self, n_produced: int, last_id: int, bits: np.ndarray) -> bool:
        import torch

        if n_produced > 0 and not self._matcher.accept_token(int(last_id)):
            self.rejected += 1
        if self._matcher.is_terminated():
            # it accepted a stop id the caller does not stop on: from here on only stop ids
            bits[:] = 0
            for i in self.stop_ids:
                bits[i >> 5] |= np.uint32(1 << (i & 31))
            return bool(self.stop_ids)
        self._matcher.fill_next_token_bitmask(torch.from_numpy(bits.view(np.int32)).view(1, -1))
        return True

    @property
    def terminated(self) -> bool:
        return self._matcher.is_terminated()


class CompiledGrammar:
    def __init__(self, compiled, vocab_size: int, stop_ids: Sequence[int]):
        self._compiled = compiled
        self.vocab_size = vocab_size
        self.stop_ids = tuple(stop_ids)

    def mask(self) -> GrammarMask:
        """A fresh per-generation mask (the engine calls it on its decode thread)."""
        return GrammarMask(self._compiled, self.vocab_size, self.stop_ids)


# The tag spelling our output parser and Qwen3's template use (strata_lab/templates/qwen3.jinja).
_EMPTY_THINK = '("<think>\\n\\n</think>\\n\\n")?'
_THOUGHT = 'thought ::= ([^<] | "<" [^/])*'
_THINK_OPENERS = {  # what comes before a forced tool call's `<tool_call>`, by thinking mode (TokenGrammar.tool_call)
    "off": 'root ::= "<tool_call>\\n"',
    "open": 'root ::= "<think>\\n" thought "</think>\\n\\n<tool_call>\\n"\n' + _THOUGHT,
    "inside": 'root ::= thought "</think>\\n\\n<tool_call>\\n"\n' + _THOUGHT,
}


class TokenGrammar:
    """Compiles grammars for one vocabulary (built once, ~1 s for Qwen3's 151K ids; compiles are cached)."""

    def __init__(self, tokenizer, vocab_size: int, *, threads: int = 2, max_string: int | None = None,
                 max_items: int | None = None):
        import xgrammar as xgr

        self.vocab_size = vocab_size
        self.max_string, self.max_items = max_string, max_items  # see bound_schema
        first_added = min(tokenizer._added.values()) if getattr(tokenizer, "_added", None) else tokenizer.vocab_size
        vocab: list[bytes] = []
        for i in range(vocab_size):
            if i >= first_added or i >= tokenizer.vocab_size:
                vocab.append(b"")  # added tokens and spare rows: no text for the grammar
                continue
            try:
                vocab.append(tokenizer.token_bytes(i))
            except ValueError:
                vocab.append(b"")
        stops = [i for i in (tokenizer.im_end_id, tokenizer.eos_id) if i is not None]
        self.stop_ids = tuple(stops)
        self._info = xgr.TokenizerInfo(vocab, vocab_type=xgr.VocabType.RAW, vocab_size=vocab_size,
                                       stop_token_ids=stops)
        self._compiler = xgr.GrammarCompiler(self._info, max_threads=threads)
        self._lock = threading.Lock()
        self._cache: dict[str, CompiledGrammar] = {}

    def _cached(self, key: str, build) -> CompiledGrammar:
        with self._lock:
            if key not in self._cache:
                try:
                    self._cache[key] = CompiledGrammar(build(), self.vocab_size, self.stop_ids)
                except (RuntimeError, ValueError, TypeError) as exc:
                    raise GrammarError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
                if len(self._cache) > 256:
                    self._cache.pop(next(iter(self._cache)))
            return self._cache[key]

    def cached_keys(self) -> set[str]:
        with self._lock:
            return set(self._cache)

    def export(self, keys) -> dict[str, str]:
        """The compiled grammars under `keys`, serialized (xgrammar's JSON): a worker process that compiled them
        hands them to the server this way (strata_lab.server.cpu)."""
        with self._lock:
            return {k: self._cache[k]._compiled.serialize_json() for k in keys if k in self._cache}

    def adopt(self, exported: dict[str, str]) -> None:
        """Take compiled grammars from `export` into this compiler's cache (no compile: a deserialization)."""
        import xgrammar as xgr

        for key, text in exported.items():
            compiled = CompiledGrammar(xgr.CompiledGrammar.deserialize_json(text, self._info), self.vocab_size,
                                       self.stop_ids)
            with self._lock:
                self._cache[key] = compiled
                if len(self._cache) > 256:
                    self._cache.pop(next(iter(self._cache)))

    def after_fork(self) -> None:
        """In a forked worker: a fresh lock (a server thread may have held this one at the fork)."""
        self._lock = threading.Lock()

    def json_schema(self, schema: dict, *, think_prefix: bool = True) -> CompiledGrammar:
        """JSON matching `schema` (compact whitespace), optionally after Qwen3's empty think block."""
        text = json.dumps(bound_schema(schema, self.max_string, self.max_items), sort_keys=True)

        def build():
            body = json_schema_grammar(text)
            return self._compiler.compile_grammar(self._with_prefix(body, think_prefix))

        return self._cached(f"json:{think_prefix}:{text}", build)

    def gbnf(self, grammar: str, *, think_prefix: bool = False) -> CompiledGrammar:
        """A llama.cpp GBNF grammar (xgrammar reads GBNF/EBNF with a `root` rule; SGLang's `ebnf` too)."""
        import xgrammar as xgr

        return self._cached(f"gbnf:{think_prefix}:{grammar}", lambda: self._compiler.compile_grammar(
            self._with_prefix(xgr.Grammar.from_ebnf(grammar), think_prefix)))

    def regex(self, pattern: str, *, think_prefix: bool = False) -> CompiledGrammar:
        """Text matching the regular expression `pattern` as a whole (vLLM `guided_regex`, SGLang `regex`)."""
        import xgrammar as xgr

        return self._cached(f"regex:{think_prefix}:{pattern}", lambda: self._compiler.compile_grammar(
            self._with_prefix(xgr.Grammar.from_regex(pattern), think_prefix)))

    def choice(self, options: Sequence[str], *, think_prefix: bool = False) -> CompiledGrammar:
        """Exactly one of `options` (vLLM `guided_choice`)."""
        return self.gbnf(choice_ebnf(options), think_prefix=think_prefix)

    def tool_call(self, tools: Sequence[dict], name: str | None = None, *, thinking: str = "off") -> CompiledGrammar:
        """One call in Qwen3's tool-call syntax: `<tool_call>\\n{"name": N, "arguments": {...}}\\n</tool_call>`,
        N one of `tools` (or `name`), arguments matching that tool's parameters.

        `thinking`: "off" - the output starts at the call; "open" - a thought first (`<think>\\n...</think>\\n\\n`),
        as Qwen3's template expects with thinking on; "inside" - the prompt already opened the thought: it
        goes on, closes, then the call. A thought holds no `</` (it ends at the first one)."""
        if thinking not in _THINK_OPENERS:
            raise ValueError(f"thinking must be one of {', '.join(_THINK_OPENERS)}, got {thinking!r}")
        import xgrammar as xgr

        chosen = [t for t in tools if name is None or t["function"]["name"] == name]
        options = []
        for i, t in enumerate(chosen):
            fn = t["function"]
            params = bound_schema(fn.get("parameters") or {"type": "object"}, self.max_string, self.max_items)
            # the parameters' own references ("#", "#/$defs/...") are relative to the parameters, not the wrapper
            where = "/properties/arguments" if len(chosen) == 1 else f"/anyOf/{i}/properties/arguments"
            params = rebase_refs(params, where)
            options.append({"type": "object", "properties": {"name": {"const": fn["name"]}, "arguments": params},
                "required": ["name", "arguments"], "additionalProperties": False})
        if not options:
            raise GrammarError(f"no tool named {name!r}")
        schema = options[0] if len(options) == 1 else {"anyOf": options}
        text = json.dumps(schema, sort_keys=True)

        def build():
            call = json_schema_grammar(text)
            open_ = xgr.Grammar.from_ebnf(_THINK_OPENERS[thinking])
            close = xgr.Grammar.from_ebnf('root ::= "\\n</tool_call>"')
            return self._compiler.compile_grammar(xgr.Grammar.concat(open_, call, close))

        return self._cached(f"tool:{thinking}:{text}", build)

    @staticmethod
    def _with_prefix(body: Any, think_prefix: bool):
        import xgrammar as xgr

        if not think_prefix:
            return body
        return xgr.Grammar.concat(xgr.Grammar.from_ebnf(f"root ::= {_EMPTY_THINK}"), body)
