"""Request fields beyond plain chat: sampling fan-out, logprobs, slots, constraints (issue 17).

Kept apart from request.py's chat parsing: `parse_features(body, dialect)` reads only these fields and
returns one `Features`, which the chat and completion parsers attach to their request. Every field is
checked here (a bad one is a 400 naming it) before any work.

OpenAI: `n`, `logprobs` (bool) + `top_logprobs` (0..20), `prompt_logprobs` (vLLM, int), `user` (slot key),
`tool_choice`; llama.cpp: `n_probs`, `id_slot`, `grammar` (GBNF), `json_schema`; Anthropic:
`metadata.user_id` (slot key), `tool_choice` ({"type": "auto"|"any"|"tool"|"none"}).

>>> f = parse_features({"n": 2, "logprobs": True, "top_logprobs": 3, "user": "alice"}, "openai")
>>> (f.n, f.logprobs, f.session_key)
(2, 3, 'alice')
>>> parse_features({"logprobs": True}, "openai").logprobs
0
>>> parse_features({"tool_choice": {"type": "tool", "name": "f"}}, "anthropic").tool_choice
'f'
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from strata_lab.server.errors import RequestError

__all__ = ["Features", "Constraint", "parse_features", "MAX_N", "MAX_TOP_LOGPROBS"]

MAX_N = 16
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class Constraint:
    """What the output must match: a JSON schema, or a GBNF grammar (llama.cpp's `grammar`)."""

    kind: str                  # "json_schema" | "gbnf"
    source: Any                # the schema (dict) or the grammar text
    field: str                 # the request field it came from (for errors)

    def __post_init__(self):
        if self.kind not in ("json_schema", "gbnf"):
            raise ValueError(f"kind must be 'json_schema' or 'gbnf', got {self.kind!r}")


@dataclass(frozen=True)
class Features:
    n: int = 1                             # choices, all from one prefill
    logprobs: int | None = None            # None: off; k: each generated id's logprob and k alternatives
    prompt_logprobs: int | None = None     # None: off; k: each prompt id's logprob and k alternatives
    slot: int | None = None                # id_slot: this slot, whatever the rule would pick
    session_key: str | None = None         # user / metadata.user_id / x-session-id: sticks to one slot
    tool_choice: str | None = None         # None/"auto", "none", "required" (any tool), or a tool name
    constraint: Constraint | None = None   # grammar / json_schema (llama.cpp)
    cache_prompt: bool = True              # llama.cpp: False reads the whole prompt again

    def __post_init__(self):
        if not 1 <= self.n <= MAX_N:
            raise ValueError(f"n must be in 1..{MAX_N}, got {self.n}")


def _int(value: Any, name: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(name, f"must be an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise RequestError(name, f"must be in {lo}..{hi}, got {value}")
    return value


def _key(value: Any, name: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= 256:
        raise RequestError(name, "must be a non-empty string of at most 256 characters")
    return value


def _tool_choice(value: Any, dialect: str) -> str | None:
    if value is None:
        return None
    if dialect == "openai":
        if isinstance(value, str):
            if value not in ("auto", "none", "required"):
                raise RequestError("tool_choice", f"must be 'auto', 'none', 'required' or a named function, got {value!r}")
            return None if value == "auto" else value
        if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("function"), dict):
            name = value["function"].get("name")
            if isinstance(name, str) and name:
                return name
        raise RequestError("tool_choice", "must be 'auto', 'none', 'required' or "
                           "{'type': 'function', 'function': {'name': ...}}")
    if not isinstance(value, dict):
        raise RequestError("tool_choice", "must be an object such as {'type': 'any'}")
    kind = value.get("type")
    if kind == "auto":
        return None
    if kind == "none":
        return "none"
    if kind == "any":
        return "required"
    if kind == "tool":
        name = value.get("name")
        if not isinstance(name, str) or not name:
            raise RequestError("tool_choice.name", "must name a tool")
        return name
    raise RequestError("tool_choice.type", f"must be 'auto', 'any', 'tool' or 'none', got {kind!r}")


def _constraint(body: dict, budget=None) -> Constraint | None:
    grammar, schema = body.get("grammar"), body.get("json_schema")
    if grammar is not None and schema is not None:
        raise RequestError("grammar", "cannot be combined with json_schema")
    if grammar is not None:
        if not isinstance(grammar, str) or not grammar.strip():
            raise RequestError("grammar", "must be a non-empty GBNF grammar string")
        if len(grammar) > 100_000:
            raise RequestError("grammar", "is longer than 100000 characters")
        return Constraint("gbnf", grammar, "grammar")
    if schema is not None:
        if not isinstance(schema, dict):
            raise RequestError("json_schema", "must be a JSON schema object")
        from strata_lab.server.schemas import check_schema

        check_schema(schema, "json_schema", budget)  # the same check as response_format and tool parameters
        return Constraint("json_schema", schema, "json_schema")
    return None


def parse_features(body: dict, dialect: str, *, header_key: str | None = None, schema_budget=None) -> Features:
    """The issue-17 fields of a request body (`dialect` "openai" or "anthropic"); 400 on a bad one."""
    kw: dict = {}
    if body.get("n") is not None:
        kw["n"] = _int(body["n"], "n", 1, MAX_N)
    top = body.get("top_logprobs")
    if top is not None:
        top = _int(top, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    lp = body.get("logprobs")
    if lp is not None:
        if isinstance(lp, bool):
            if lp:
                kw["logprobs"] = top or 0
        else:  # /v1/completions: logprobs is the number of alternatives
            kw["logprobs"] = _int(lp, "logprobs", 0, MAX_TOP_LOGPROBS)
    if top is not None and "logprobs" not in kw:
        raise RequestError("top_logprobs", "needs logprobs: true")
    if body.get("n_probs") is not None:
        n_probs = _int(body["n_probs"], "n_probs", 0, MAX_TOP_LOGPROBS)
        if n_probs > 0:
            kw["logprobs"] = n_probs
    if body.get("prompt_logprobs") is not None:
        kw["prompt_logprobs"] = _int(body["prompt_logprobs"], "prompt_logprobs", 0, MAX_TOP_LOGPROBS)
    if body.get("id_slot") is not None:
        slot = _int(body["id_slot"], "id_slot", -1, 1 << 16)
        kw["slot"] = None if slot == -1 else slot  # llama.cpp: -1 lets the server pick
    key = header_key
    if key is None and dialect == "openai":
        key = _key(body.get("user"), "user")
    if key is None and dialect == "anthropic" and body.get("metadata") is not None:
        meta = body["metadata"]
        if not isinstance(meta, dict):
            raise RequestError("metadata", "must be an object")
        key = _key(meta.get("user_id"), "metadata.user_id")
    kw["session_key"] = key
    kw["tool_choice"] = _tool_choice(body.get("tool_choice"), dialect)
    kw["constraint"] = _constraint(body, schema_budget)
    if body.get("cache_prompt") is not None:
        if not isinstance(body["cache_prompt"], bool):
            raise RequestError("cache_prompt", "must be a boolean")
        kw["cache_prompt"] = body["cache_prompt"]
    return Features(**kw)
