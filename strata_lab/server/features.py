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

from strata_lab.server.controls import Controls, parse_controls
from strata_lab.server.errors import RequestError

__all__ = ["Features", "Constraint", "parse_features", "MAX_N", "MAX_TOP_LOGPROBS"]

MAX_N = 16
MAX_TOP_LOGPROBS = 20
CONSTRAINT_KINDS = ("json_schema", "gbnf", "regex", "choice")
# the fields that constrain the output, each one's kind: llama.cpp's, vLLM's (guided_*, structured_outputs)
# and SGLang's (regex, ebnf; json_schema as a JSON string); a request gives one of them
CONSTRAINT_FIELDS = {"grammar": "gbnf", "json_schema": "json_schema", "guided_json": "json_schema",
                     "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "gbnf",
                     "regex": "regex", "ebnf": "gbnf", "structured_outputs": None}
# structured_outputs (vLLM): its constraint keys, and the options accepted at their defaults only
_STRUCTURED = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "gbnf", "json_object": None}
_STRUCTURED_DEFAULTS = {"disable_fallback": False, "disable_any_whitespace": False,
                        "disable_additional_properties": False, "whitespace_pattern": None,
                        "structural_tag": None}


@dataclass(frozen=True)
class Constraint:
    """What the output must match: a JSON schema, or a GBNF grammar (llama.cpp's `grammar`)."""

    kind: str                  # "json_schema" | "gbnf" | "regex" | "choice"
    source: Any                # the schema (dict), the grammar or regex text, or the choices (a tuple)
    field: str                 # the request field it came from (for errors)

    def __post_init__(self):
        if self.kind not in CONSTRAINT_KINDS:
            raise ValueError(f"kind must be one of {', '.join(CONSTRAINT_KINDS)}, got {self.kind!r}")


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
    controls: Controls = Controls()        # vLLM / SGLang token-level fields (controls.py)
    return_token_ids: bool = False         # vLLM: prompt_token_ids and each choice's token_ids in the response

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


def _constraint_value(kind: str, value: Any, name: str, budget=None) -> Constraint:
    """One constraint field's value checked: `kind` of CONSTRAINT_KINDS, `name` the field (for errors)."""
    if kind in ("gbnf", "regex"):
        what = "GBNF grammar" if kind == "gbnf" else "regular expression"
        if not isinstance(value, str) or not value.strip():
            raise RequestError(name, f"must be a non-empty {what} string")
        if len(value) > 100_000:
            raise RequestError(name, "is longer than 100000 characters")
        return Constraint(kind, value, name)
    if kind == "choice":
        if not isinstance(value, list) or not value or len(value) > 1024:
            raise RequestError(name, "must be an array of 1..1024 strings")
        for i, v in enumerate(value):
            if not isinstance(v, str) or not v:
                raise RequestError(f"{name}[{i}]", "must be a non-empty string")
        return Constraint("choice", tuple(value), name)
    if isinstance(value, str):  # vLLM's guided_json and SGLang's json_schema may be the schema as JSON text
        import json

        try:
            value = json.loads(value)
        except ValueError:
            raise RequestError(name, "must be a JSON schema (an object, or its JSON text)") from None
    if not isinstance(value, dict):
        raise RequestError(name, "must be a JSON schema object")
    from strata_lab.server.schemas import check_schema

    check_schema(value, name, budget)  # the same check as response_format and tool parameters
    return Constraint("json_schema", value, name)


def _structured(value: Any, budget=None) -> Constraint:
    """vLLM's structured_outputs: one of json / regex / choice / grammar / json_object."""
    if not isinstance(value, dict):
        raise RequestError("structured_outputs", "must be an object")
    for key, v in value.items():
        if key in _STRUCTURED_DEFAULTS:
            if v not in (None, _STRUCTURED_DEFAULTS[key]):
                raise RequestError(f"structured_outputs.{key}", "is not supported by this server",
                                   code="unsupported_parameter")
        elif key not in _STRUCTURED:
            raise RequestError(f"structured_outputs.{key}", "is not a structured_outputs field this server "
                               f"knows (it takes {', '.join(_STRUCTURED)})", code="unsupported_parameter")
    given = [k for k in _STRUCTURED if value.get(k) not in (None, False)]
    if len(given) != 1:
        raise RequestError("structured_outputs", f"must set exactly one of {', '.join(_STRUCTURED)}, got "
                           f"{len(given)}")
    key = given[0]
    if key == "json_object":
        if value[key] is not True:
            raise RequestError("structured_outputs.json_object", "must be a boolean")
        return Constraint("json_schema", {"type": "object"}, "structured_outputs.json_object")
    return _constraint_value(_STRUCTURED[key], value[key], f"structured_outputs.{key}", budget)


def _constraint(body: dict, budget=None) -> Constraint | None:
    given = [name for name in CONSTRAINT_FIELDS if body.get(name) is not None]
    if len(given) > 1:
        raise RequestError(given[1], f"cannot be combined with {given[0]} (one output constraint per request)")
    if not given:
        return None
    name = given[0]
    if name == "structured_outputs":
        return _structured(body[name], budget)
    return _constraint_value(CONSTRAINT_FIELDS[name], body[name], name, budget)


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
    kw["controls"] = parse_controls(body)
    if dialect == "openai" and body.get("return_token_ids") is not None:
        if not isinstance(body["return_token_ids"], bool):
            raise RequestError("return_token_ids", "must be a boolean")
        kw["return_token_ids"] = body["return_token_ids"]
    return Features(**kw)
