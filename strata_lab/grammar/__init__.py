"""Constrained decoding: grammars compiled with xgrammar over our vocabulary, applied as a token mask
inside the engine's decode loop (see `TokenGrammar`, `GrammarMask`)."""
from strata_lab.grammar.xgr import GrammarMask, TokenGrammar

__all__ = ["TokenGrammar", "GrammarMask"]
