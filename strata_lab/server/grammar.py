"""Which grammar a request's output must follow, compiled lazily over the server's vocabulary.

`response_format` json_object / json_schema, llama.cpp `grammar` (GBNF) and `json_schema`, and
`tool_choice` required / any / a named tool (the call generated in the template's tool-call syntax, so
the output parser reads it back as a tool call). `check(req)` compiles before the request queues (a bad
schema or grammar is a 400 naming the field); `mask_for(req)` hands a fresh per-generation mask to the
engine call.
"""
from __future__ import annotations

import threading

from strata_lab.server.errors import RequestError
from strata_lab.server.request import ChatRequest

__all__ = ["GrammarCompiler"]


class GrammarCompiler:
    def __init__(self, tokenizer, vocab_size: int, *, max_string: int | None = None, max_items: int | None = None):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_string, self.max_items = max_string, max_items
        self._grammar = None
        self._lock = threading.Lock()
        self._known: dict[str, None] = {}  # requests' constraint keys compiled before (the compile cache holds them)

    def _tg(self):
        with self._lock:
            if self._grammar is None:  # built on first use: ~3 s, and xgrammar imports torch
                try:
                    from strata_lab.grammar import TokenGrammar
                except ImportError:
                    raise RequestError(None, "constrained decoding needs xgrammar on the server: "
                                       "pip install 'strata-lab[grammar]'", code="grammar_unavailable") from None

                self._grammar = TokenGrammar(self.tokenizer, self.vocab_size, max_string=self.max_string,
                                             max_items=self.max_items)
            return self._grammar

    @staticmethod
    def thinking(req: ChatRequest, rendered=None) -> str:
        """A forced tool call's thinking mode (TokenGrammar.tool_call): "inside" when the prompt opened a
        thought, "open" when thinking was asked for (Anthropic `thinking`, `enable_thinking`, a thinking
        budget), else "off": the call comes first."""
        if rendered is not None and not rendered.raw:
            from strata_lab.server.output import OutputParser

            probe = OutputParser()
            probe.prime(rendered.assistant_text)
            if probe.in_reasoning:
                return "inside"
            if "</think>" in rendered.assistant_text:
                return "off"  # the template already closed the (empty) thought
        if req.enable_thinking or (req.thinking_budget is not None and req.enable_thinking is not False):
            return "open"
        return "off"

    @staticmethod
    def think_prefix(req: ChatRequest, rendered=None) -> bool:
        """Whether a schema / regex / choice grammar admits Qwen3's empty think block first: on a chat turn
        whose thinking is not off (`enable_thinking: false`, Anthropic `thinking: disabled`, or a template
        that already closed the thought); never on a raw completion."""
        if not req.messages or req.enable_thinking is False:
            return False
        if rendered is not None and (rendered.raw or "</think>" in rendered.assistant_text):
            return False
        return True

    def compiled(self, req: ChatRequest, rendered=None):
        """The compiled grammar for `req` (its prompt as `rendered`), or None when its output is free."""
        from strata_lab.grammar.xgr import GrammarError

        f = req.features
        field = "response_format"
        try:
            if f.tool_choice not in (None, "none") and req.tools:
                field = "tool_choice"
                name = None if f.tool_choice == "required" else f.tool_choice
                return self._tg().tool_call(req.tools, name, thinking=self.thinking(req, rendered))
            think = self.think_prefix(req, rendered)
            c = f.constraint
            if c is not None:
                field = c.field
                if c.kind == "gbnf":  # a grammar says all the output: no think block unless it spells one
                    return self._tg().gbnf(c.source)
                if c.kind == "regex":
                    return self._tg().regex(c.source, think_prefix=think)
                if c.kind == "choice":
                    return self._tg().choice(c.source, think_prefix=think)
                return self._tg().json_schema(c.source, think_prefix=think)
            if req.schema is not None:
                return self._tg().json_schema(req.schema, think_prefix=think)
        except GrammarError as exc:
            raise RequestError(field, f"cannot be compiled into a grammar: {exc}") from None
        return None

    def check(self, req: ChatRequest, rendered=None) -> None:
        self.compiled(req, rendered)
        with self._lock:
            self._known[_key(req)] = None
            if len(self._known) > 256:  # as many as TokenGrammar caches
                self._known.pop(next(iter(self._known)))

    def ensure(self) -> None:
        """Build the vocabulary's compiler now (seconds, once): a worker forked later shares it."""
        self._tg()

    def export_check(self, req: ChatRequest, rendered=None) -> dict[str, str]:
        """`check` in a worker process (strata_lab.server.cpu): the grammars it compiled, serialized for `adopt`."""
        tg = self._tg()
        before = tg.cached_keys()
        self.check(req, rendered)
        return tg.export(tg.cached_keys() - before)

    def adopt(self, req: ChatRequest, exported: dict[str, str]) -> None:
        """Take what `export_check` compiled in a worker: `req`'s grammar is then compiled here too."""
        self._tg().adopt(exported)
        with self._lock:
            self._known[_key(req)] = None
            if len(self._known) > 256:
                self._known.pop(next(iter(self._known)))

    def after_fork(self) -> None:
        """In a forked worker: fresh locks (a server thread may have held them at the fork)."""
        self._lock = threading.Lock()
        if self._grammar is not None:
            self._grammar.after_fork()

    def known(self, req: ChatRequest) -> bool:
        """Whether `req`'s grammar compiled before (then checking it again is cheap: no pool needed)."""
        return self._grammar is not None and _key(req) in self._known

    def mask_for(self, req: ChatRequest, rendered=None):
        g = self.compiled(req, rendered)
        return None if g is None else g.mask()


def _key(req: ChatRequest) -> str:
    import json

    f = req.features
    c = f.constraint
    return json.dumps([f.tool_choice, req.tools if f.tool_choice not in (None, "none") else None,
                       None if c is None else [c.kind, c.source], req.schema, req.messages == [],
                       req.enable_thinking is False],
                      sort_keys=True, default=str)
