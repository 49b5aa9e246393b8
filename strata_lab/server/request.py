"""One internal request type, `ChatRequest`, and the two parsers that fill it at the edge.

Fields the server does not implement are refused first, from the one table in unsupported.py.

OpenAI `/v1/chat/completions` and Anthropic `/v1/messages` bodies are checked field by field; a bad field
raises `RequestError` naming it (the HTTP layer turns that into a 400 before any work). Unknown fields are
ignored. Messages end up in OpenAI shape, which is what the chat template renders. The ecosystem's ways
of continuing an assistant turn (Anthropic's trailing assistant message, `continue_final_message`) become
`assistant_prefix`, so the rest of the server knows one spelling.

>>> req = parse_openai({"messages": [{"role": "user", "content": "hi"}], "n_predict": 0})
>>> req.max_tokens, req.dialect
(0, 'openai')
>>> parse_anthropic({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"},
...                  {"role": "assistant", "content": "Sure:"}]}).assistant_prefix
'Sure:'

Why one module: both dialects fill the same `ChatRequest` with the same field helpers; one file keeps
the two parsers side by side, so a field is validated the same way in both.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from strata_lab.server.errors import RequestError
from strata_lab.server.schemas import MAX_TOOLS, SchemaBudget, check_schema
from strata_lab.server.unsupported import UNSUPPORTED, refuse_unsupported
from strata_lab.server.features import Features, parse_features

__all__ = ["ChatRequest", "parse_openai", "parse_anthropic", "check_int", "UNSUPPORTED"]

_OPENAI_ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass
class ChatRequest:
    """A chat request in the server's own terms, whichever dialect it came in.

    `max_tokens` None means "up to the context"; 0 means evaluate the prompt and generate nothing.
    `max_tokens_field` is the client's name for it, for error messages.
    """

    dialect: str
    messages: list[dict]
    tools: list[dict] | None = None
    stream: bool = False
    include_usage: bool = False           # OpenAI stream_options.include_usage
    max_tokens: int | None = None
    max_tokens_field: str = "max_tokens"
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None               # None: a fresh seed per request (reported in the response)
    min_p: float = 0.0
    logit_bias: tuple = ()                # ((id or text, bias), ...): a text's ids all get the bias
    frequency_penalty: float = 0.0        # OpenAI semantics: over the ids generated so far
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0       # HF / llama.cpp semantics over the last `repeat_last_n` ids
    repeat_last_n: int = 64               # of prompt + output; -1: all of them; 0: off
    ignore_eos: bool = False              # llama.cpp: the end-of-turn ids are banned (bias -100)
    parallel_tool_calls: bool = True      # False: the reply ends after its first tool call
    assistant_prefix: str | None = None
    enable_thinking: bool | None = None
    thinking_budget: int | None = None
    response_format: dict | None = None  # {"type": "json_schema", "json_schema": {"name", "schema"}}
    stop: tuple[str, ...] = ()           # stop sequences: generation ends before the first one in the text
    model: str | None = None
    extra: dict = field(default_factory=dict)
    features: Features = field(default_factory=Features)  # n, logprobs, slots, constraints (features.py)

    def __post_init__(self) -> None:
        if self.dialect not in ("openai", "anthropic"):
            raise ValueError(f"dialect must be 'openai' or 'anthropic', got {self.dialect!r}")
        if self.max_tokens is not None and self.max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0 or None, got {self.max_tokens}")
        if self.assistant_prefix == "":
            self.assistant_prefix = None  # "" leaves behaviour unchanged

    @property
    def schema(self) -> dict | None:
        """The JSON schema the output must satisfy, if any."""
        if self.response_format and self.response_format.get("type") == "json_schema":
            return self.response_format["json_schema"]["schema"]
        return None


# --- field checks -----------------------------------------------------------------------------------
def check_int(value: Any, name: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """`value` as an int, or a RequestError naming `name` (bools, floats and strings are not ints)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(name, f"must be an integer, got {_kind(value)}")
    if minimum is not None and value < minimum:
        raise RequestError(name, f"must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise RequestError(name, f"must be <= {maximum}, got {value}")
    return value


def _number(value: Any, name: str, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(name, f"must be a number, got {_kind(value)}")
    if not lo <= value <= hi:
        raise RequestError(name, f"must be between {lo} and {hi}, got {value}")
    return float(value)


def _bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise RequestError(name, f"must be a boolean, got {_kind(value)}")
    return value


def _str(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise RequestError(name, f"must be a string, got {_kind(value)}")
    return value


def _dict(value: Any, name: str) -> dict:
    if not isinstance(value, dict):
        raise RequestError(name, f"must be an object, got {_kind(value)}")
    return value


def _list(value: Any, name: str, *, nonempty: bool = False) -> list:
    if not isinstance(value, list):
        raise RequestError(name, f"must be an array, got {_kind(value)}")
    if nonempty and not value:
        raise RequestError(name, "must not be empty")
    return value


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
            dict: "an object"}.get(type(value), type(value).__name__)


def _opt(body: dict, name: str) -> Any:
    return body.get(name)


def _body(body: Any) -> dict:
    if not isinstance(body, dict):
        raise RequestError("body", f"must be a JSON object, got {_kind(body)}")
    return body


def _prefix(value: Any, name: str) -> str | None:
    if value is None or value == "":
        return None
    return _str(value, name)


# Sampler values (docs/SERVER_BEHAVIOUR.md, "Sampler values"): a temperature under GREEDY_BELOW is greedy
# (dividing logits by it would overflow: 1e-40 sampled at random); a top_p under MIN_TOP_P acts as MIN_TOP_P,
# which already keeps only the most likely id (its probability is at least 1 / vocabulary > 1e-6), and the
# engine's float32 would read 1e-50 as 0; a repetition penalty is in [MIN_REPETITION_PENALTY, 10] (a
# smaller one multiplies logits past float32's range).
GREEDY_BELOW = 1e-5
MIN_TOP_P = 1e-6
MIN_REPETITION_PENALTY = 0.01
MAX_BIAS_TEXT = 1024  # characters of one logit_bias text key (every id of its encoding gets the bias)


def _temperature(value: Any, hi: float) -> float:
    """A temperature in [0, hi]; one under GREEDY_BELOW is 0 (greedy).

    >>> _temperature(1e-40, 2.0), _temperature(0.7, 2.0)
    (0.0, 0.7)
    """
    t = _number(value, "temperature", 0.0, hi)
    return 0.0 if t < GREEDY_BELOW else t


def _sampling(body: dict, req: dict) -> None:
    if body.get("temperature") is not None:
        req["temperature"] = _temperature(body["temperature"], 2.0)
    if body.get("top_p") is not None:
        req["top_p"] = _number(body["top_p"], "top_p", 0.0, 1.0)
        if req["top_p"] == 0:
            raise RequestError("top_p", "must be > 0")
        req["top_p"] = max(req["top_p"], MIN_TOP_P)
    if body.get("top_k") is not None:
        req["top_k"] = check_int(body["top_k"], "top_k", minimum=0, maximum=1 << 20)
    if body.get("seed") is not None:
        req["seed"] = check_int(body["seed"], "seed", minimum=0, maximum=2**64 - 1)
        if req["seed"] == 2**32 - 1:  # llama.cpp's LLAMA_DEFAULT_SEED (-1 as uint32): "pick one for me"
            req["seed"] = None
    if body.get("min_p") is not None:
        req["min_p"] = _number(body["min_p"], "min_p", 0.0, 1.0)
    for name in ("frequency_penalty", "presence_penalty"):
        if body.get(name) is not None:
            req[name] = _number(body[name], name, -2.0, 2.0)
    rep = [n for n in ("repetition_penalty", "repeat_penalty") if body.get(n) is not None]
    if len(rep) == 2 and body["repetition_penalty"] != body["repeat_penalty"]:
        raise RequestError("repeat_penalty", "is llama.cpp's name for repetition_penalty: give one of them")
    if rep:
        req["repetition_penalty"] = _number(body[rep[0]], rep[0], MIN_REPETITION_PENALTY, 10.0)
    if body.get("repeat_last_n") is not None:
        req["repeat_last_n"] = check_int(body["repeat_last_n"], "repeat_last_n", minimum=-1, maximum=1 << 20)
    if body.get("logit_bias") is not None:
        req["logit_bias"] = parse_logit_bias(body["logit_bias"])
    if body.get("ignore_eos") is not None:
        req["ignore_eos"] = _bool(body["ignore_eos"], "ignore_eos")


def parse_logit_bias(value: Any, name: str = "logit_bias") -> tuple:
    """OpenAI's {"id": bias} and llama.cpp's {"id or text": bias or false} and [[id or text, bias or false], ...]
    as ((id or text, bias), ...).

    A bias is a number in -100..100, added to the id's logit; -100 (and llama.cpp's `false`) bans the id.
    A text key (llama.cpp: an object key that is not a whole integer, or a string in a pair) biases every id
    of its encoding. Ids are checked against the vocabulary later.

    >>> parse_logit_bias({"15": -100, "7": 2})
    ((15, -100.0), (7, 2.0))
    >>> parse_logit_bias({" Hello": False, "3": 1})
    ((' Hello', -100.0), (3, 1.0))
    >>> parse_logit_bias([[15, False], ["Hello", 1]])
    ((15, -100.0), ('Hello', 1.0))
    """
    def bias(v: Any, where: str) -> float:
        if v is False:
            return -100.0
        return _number(v, where, -100.0, 100.0)

    out = []
    if isinstance(value, dict):
        for key, v in value.items():
            if not key:
                raise RequestError(f"{name}.{key}", "keys must be token ids or non-empty text")
            tid: Any = key
            if key.lstrip("-").isdigit() and key.isascii():  # llama.cpp: a whole integer is an id, else text
                tid = int(key)
                if tid < 0:
                    raise RequestError(f"{name}.{key}", "must be a token id >= 0")
            out.append((tid, bias(v, f"{name}.{key}")))
    elif isinstance(value, list):
        for i, pair in enumerate(value):
            if not isinstance(pair, list) or len(pair) != 2:
                raise RequestError(f"{name}[{i}]", "must be a pair [token id or text, bias]")
            key = pair[0]
            if isinstance(key, str):
                if not key:
                    raise RequestError(f"{name}[{i}][0]", "must not be empty")
            else:
                key = check_int(key, f"{name}[{i}][0]", minimum=0)
            out.append((key, bias(pair[1], f"{name}[{i}][1]")))
    else:
        raise RequestError(name, f"must be an object {{token id: bias}} or an array of pairs, got {_kind(value)}")
    if len(out) > 1024:
        raise RequestError(name, f"holds at most 1024 entries, got {len(out)}")
    for i, (key, _) in enumerate(out):
        if isinstance(key, str) and len(key) > MAX_BIAS_TEXT:
            raise RequestError(name, f"a text key is at most {MAX_BIAS_TEXT} characters (entry {i} has "
                               f"{len(key)})")
    return tuple(out)


def _response_format(value: Any, name: str = "response_format", budget: SchemaBudget | None = None) -> dict | None:
    if value is None:
        return None
    value = _dict(value, name)
    kind = _str(value.get("type"), f"{name}.type")
    if kind == "text":
        return None
    if kind == "json_object":  # llama.cpp: an optional `schema` narrows the object
        schema = {"type": "object"}
        if value.get("schema") is not None:
            schema = _dict(value["schema"], f"{name}.schema")
            check_schema(schema, f"{name}.schema")
        return {"type": "json_schema", "json_schema": {"name": "json_object", "schema": schema}}
    if kind != "json_schema":
        raise RequestError(f"{name}.type", f"must be 'text', 'json_object' or 'json_schema', got {kind!r}")
    spec = _dict(value.get("json_schema"), f"{name}.json_schema")
    schema = _dict(spec.get("schema", {}), f"{name}.json_schema.schema")
    check_schema(schema, f"{name}.json_schema.schema", budget)
    title = spec.get("name", "response")
    return {"type": "json_schema", "json_schema": {"name": _str(title, f"{name}.json_schema.name"),
                                                   "schema": schema}}


def _text_parts(content: Any, name: str, *, allow_none: bool = False) -> str | None:
    """OpenAI content: a string, or an array of text parts joined together."""
    if content is None:
        if allow_none:
            return None
        raise RequestError(name, "must be a string or an array of text parts, got null")
    if isinstance(content, str):
        return content
    parts = _list(content, name)
    texts = []
    for i, part in enumerate(parts):
        part = _dict(part, f"{name}[{i}]")
        kind = part.get("type")
        if kind not in ("text", "input_text", "output_text"):
            raise RequestError(f"{name}[{i}].type", f"only text parts are supported, got {kind!r}")
        texts.append(_str(part.get("text"), f"{name}[{i}].text"))
    return "".join(texts)


# --- OpenAI -----------------------------------------------------------------------------------------
def _tool_list(value: Any) -> list:
    value = _list(value, "tools")
    if len(value) > MAX_TOOLS:
        raise RequestError("tools", f"holds {len(value)} tools, more than the limit of {MAX_TOOLS}",
                           code="schema_too_large")
    return value


def _openai_tools(value: Any, budget: SchemaBudget | None = None) -> list[dict] | None:
    if value is None:
        return None
    tools = []
    for i, tool in enumerate(_tool_list(value)):
        tool = _dict(tool, f"tools[{i}]")
        if tool.get("type", "function") != "function":
            raise RequestError(f"tools[{i}].type", f"only 'function' tools are supported, got {tool.get('type')!r}")
        fn = _dict(tool.get("function"), f"tools[{i}].function")
        name = _str(fn.get("name"), f"tools[{i}].function.name")
        if not name:
            raise RequestError(f"tools[{i}].function.name", "must not be empty")
        out = {"name": name}
        if fn.get("description") is not None:
            out["description"] = _str(fn["description"], f"tools[{i}].function.description")
        if fn.get("parameters") is not None:
            out["parameters"] = _dict(fn["parameters"], f"tools[{i}].function.parameters")
            check_schema(out["parameters"], f"tools[{i}].function.parameters", budget)
        tools.append({"type": "function", "function": out})
    return tools or None


def _openai_tool_calls(value: Any, name: str) -> list[dict]:
    calls = []
    for i, call in enumerate(_list(value, name)):
        call = _dict(call, f"{name}[{i}]")
        fn = _dict(call.get("function"), f"{name}[{i}].function")
        fname = _str(fn.get("name"), f"{name}[{i}].function.name")
        args = fn.get("arguments", "{}")
        if not isinstance(args, (str, dict)):
            raise RequestError(f"{name}[{i}].function.arguments", f"must be a string or an object, got {_kind(args)}")
        entry = {"type": "function", "function": {"name": fname, "arguments": args}}
        if call.get("id") is not None:
            entry["id"] = _str(call["id"], f"{name}[{i}].id")
        calls.append(entry)
    return calls


def _openai_messages(value: Any) -> list[dict]:
    messages = []
    for i, msg in enumerate(_list(value, "messages", nonempty=True)):
        name = f"messages[{i}]"
        msg = _dict(msg, name)
        role = msg.get("role")
        if role not in _OPENAI_ROLES:
            raise RequestError(f"{name}.role", f"must be one of {', '.join(_OPENAI_ROLES)}, got {role!r}")
        out: dict = {"role": "system" if role == "developer" else role}
        if role == "assistant":
            out["content"] = _text_parts(msg.get("content"), f"{name}.content", allow_none=True) or ""
            if msg.get("tool_calls") is not None:
                out["tool_calls"] = _openai_tool_calls(msg["tool_calls"], f"{name}.tool_calls")
            if msg.get("reasoning_content") is not None:
                out["reasoning_content"] = _str(msg["reasoning_content"], f"{name}.reasoning_content")
        else:
            out["content"] = _text_parts(msg.get("content"), f"{name}.content")
        if role == "tool" and msg.get("tool_call_id") is not None:
            out["tool_call_id"] = _str(msg["tool_call_id"], f"{name}.tool_call_id")
        messages.append(out)
    return messages


def parse_openai(body: Any, *, session_key: str | None = None) -> ChatRequest:
    """Check an OpenAI chat-completions body and turn it into a ChatRequest.

    Output cap, in order: `max_completion_tokens`, `max_tokens`, then llama.cpp's `n_predict`
    (0 = prompt only, -1 = up to the context). A non-integer `n_predict` is an error even when unused.

    >>> parse_openai({"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "n_predict": 7}).max_tokens
    2
    """
    body = _body(body)
    refuse_unsupported(body, "openai")
    req: dict = {"dialect": "openai", "messages": _openai_messages(body.get("messages"))}
    req["model"] = _str(body["model"], "model") if body.get("model") is not None else None
    if body.get("stream") is not None:
        req["stream"] = _bool(body["stream"], "stream")
    options = body.get("stream_options")
    if options is not None:
        options = _dict(options, "stream_options")
        if not req.get("stream"):
            raise RequestError("stream_options", "is only allowed when stream is true")
        if options.get("include_usage") is not None:
            req["include_usage"] = _bool(options["include_usage"], "stream_options.include_usage")
    n_predict = None
    if body.get("n_predict") is not None:
        n_predict = check_int(body["n_predict"], "n_predict", minimum=-1)
    for name in ("max_completion_tokens", "max_tokens"):
        if body.get(name) is not None:
            req["max_tokens"] = check_int(body[name], name, minimum=0)
            req["max_tokens_field"] = name
            break
    else:
        if n_predict is not None and n_predict >= 0:
            req["max_tokens"] = n_predict
            req["max_tokens_field"] = "n_predict"
    _sampling(body, req)
    budget = SchemaBudget()  # one request's schemas share the size limits
    req["tools"] = _openai_tools(body.get("tools"), budget)
    if body.get("parallel_tool_calls") is not None:
        req["parallel_tool_calls"] = _bool(body["parallel_tool_calls"], "parallel_tool_calls")
    req["response_format"] = _response_format(body.get("response_format"), budget=budget)
    prefix = _prefix(body.get("assistant_prefix"), "assistant_prefix")
    if body.get("continue_final_message") is not None and _bool(body["continue_final_message"],
                                                                "continue_final_message"):
        last = req["messages"][-1]
        if last["role"] != "assistant" or last.get("tool_calls"):
            raise RequestError("continue_final_message", "needs a final assistant message with text content")
        if prefix is not None:
            raise RequestError("assistant_prefix", "cannot be combined with continue_final_message")
        req["messages"] = req["messages"][:-1]
        prefix = last["content"] or None
        if not req["messages"]:
            raise RequestError("messages", "needs a message before the continued assistant message")
    req["assistant_prefix"] = prefix
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None:
        kwargs = _dict(kwargs, "chat_template_kwargs")
        for key in kwargs:
            if key != "enable_thinking":
                raise RequestError(f"chat_template_kwargs.{key}", "is not supported by this server: the template "
                                   "takes enable_thinking only", code="unsupported_parameter")
        if kwargs.get("enable_thinking") is not None:
            req["enable_thinking"] = _bool(kwargs["enable_thinking"], "chat_template_kwargs.enable_thinking")
    if body.get("enable_thinking") is not None:
        req["enable_thinking"] = _bool(body["enable_thinking"], "enable_thinking")
    if body.get("thinking_budget") is not None:
        req["thinking_budget"] = check_int(body["thinking_budget"], "thinking_budget", minimum=1)
    req["stop"] = _stop_sequences(body.get("stop"), "stop", allow_str=True)
    if body.get("separate_reasoning") is not None and not _bool(body["separate_reasoning"], "separate_reasoning"):
        raise RequestError("separate_reasoning", "false is not supported by this server: the reply's thinking is "
                           "always given apart (reasoning_content)", code="unsupported_parameter")
    req["features"] = _features(body, "openai", req, session_key, budget)
    return ChatRequest(**req)


def _features(body: dict, dialect: str, req: dict, session_key: str | None,
              budget: SchemaBudget | None = None) -> Features:
    """The issue-17 fields (features.py), checked against what the rest of the request asks for."""
    f = parse_features(body, dialect, header_key=session_key, schema_budget=budget)
    if f.n > 1 and dialect == "anthropic":
        raise RequestError("n", "is not an Anthropic field (one message per request)", code="unsupported_parameter")
    if dialect == "anthropic":  # an Anthropic message has no place for log probabilities
        for name in ("logprobs", "top_logprobs", "n_probs", "prompt_logprobs"):
            if body.get(name) not in (None, False, 0):
                raise RequestError(name, "is not supported on /v1/messages (Anthropic messages carry no "
                                   "log probabilities)", code="unsupported_parameter")
    if f.prompt_logprobs is not None and req.get("stream"):
        raise RequestError("prompt_logprobs", "is served without streaming only")
    if f.tool_choice not in (None, "none", "required") and not any(
            t["function"]["name"] == f.tool_choice for t in req.get("tools") or ()):
        raise RequestError("tool_choice", f"names {f.tool_choice!r}, which is not in tools")
    if f.tool_choice == "required" and not req.get("tools"):
        raise RequestError("tool_choice", "requires tools")
    return f


def _stop_sequences(value: Any, name: str, *, allow_str: bool) -> tuple[str, ...]:
    """OpenAI `stop` (a string or up to 4 strings) / Anthropic `stop_sequences` (a list of strings)."""
    if value is None:
        return ()
    if allow_str and isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise RequestError(name, "must be " + ("a string or " if allow_str else "") + "an array of strings")
    if allow_str and len(value) > 4:
        raise RequestError(name, f"holds at most 4 sequences, got {len(value)}")
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item:
            raise RequestError(f"{name}[{i}]", "must be a non-empty string")
        out.append(item)
    return tuple(out)


# --- Anthropic --------------------------------------------------------------------------------------
def _anthropic_text(content: Any, name: str) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for i, block in enumerate(_list(content, name)):
        block = _dict(block, f"{name}[{i}]")
        if block.get("type") != "text":
            raise RequestError(f"{name}[{i}].type", f"must be 'text' here, got {block.get('type')!r}")
        texts.append(_str(block.get("text"), f"{name}[{i}].text"))
    return "".join(texts)


def _anthropic_messages(value: Any) -> list[dict]:
    messages: list[dict] = []
    for i, msg in enumerate(_list(value, "messages", nonempty=True)):
        name = f"messages[{i}]"
        msg = _dict(msg, name)
        role = msg.get("role")
        if role not in ("user", "assistant"):
            raise RequestError(f"{name}.role", f"must be 'user' or 'assistant', got {role!r}")
        content = msg.get("content")
        if isinstance(content, str):
            messages.append({"role": role, "content": content})
            continue
        blocks = _list(content, f"{name}.content")
        texts, reasoning, calls, results = [], [], [], []
        for j, block in enumerate(blocks):
            bname = f"{name}.content[{j}]"
            block = _dict(block, bname)
            kind = block.get("type")
            if kind == "text":
                texts.append(_str(block.get("text"), f"{bname}.text"))
            elif kind == "thinking" and role == "assistant":
                reasoning.append(_str(block.get("thinking"), f"{bname}.thinking"))
            elif kind == "redacted_thinking" and role == "assistant":
                continue
            elif kind == "tool_use" and role == "assistant":
                calls.append({"id": _str(block.get("id"), f"{bname}.id"), "type": "function",
                              "function": {"name": _str(block.get("name"), f"{bname}.name"),
                                           "arguments": _dict(block.get("input", {}), f"{bname}.input")}})
            elif kind == "tool_result" and role == "user":
                result = block.get("content", "")
                results.append({"role": "tool", "tool_call_id": _str(block.get("tool_use_id"), f"{bname}.tool_use_id"),
                                "content": _anthropic_text(result, f"{bname}.content")})
            else:
                raise RequestError(f"{bname}.type", f"unsupported block type {kind!r} in a {role} message")
        if role == "assistant":
            out = {"role": "assistant", "content": "".join(texts)}
            if reasoning:
                out["reasoning_content"] = "".join(reasoning)
            if calls:
                out["tool_calls"] = calls
            messages.append(out)
        else:
            messages.extend(results)
            if texts or not results:
                messages.append({"role": "user", "content": "".join(texts)})
    return messages


def _anthropic_tools(value: Any, budget: SchemaBudget | None = None) -> list[dict] | None:
    if value is None:
        return None
    tools = []
    for i, tool in enumerate(_tool_list(value)):
        tool = _dict(tool, f"tools[{i}]")
        name = _str(tool.get("name"), f"tools[{i}].name")
        if not name:
            raise RequestError(f"tools[{i}].name", "must not be empty")
        fn = {"name": name, "parameters": _dict(tool.get("input_schema", {"type": "object"}),
                                                f"tools[{i}].input_schema")}
        check_schema(fn["parameters"], f"tools[{i}].input_schema", budget)
        if tool.get("description") is not None:
            fn["description"] = _str(tool["description"], f"tools[{i}].description")
        tools.append({"type": "function", "function": fn})
    return tools or None


def parse_anthropic(body: Any, *, session_key: str | None = None) -> ChatRequest:
    """Check an Anthropic messages body and turn it into a ChatRequest.

    A trailing assistant message is the assistant prefix (Anthropic's prefill). `max_tokens` is required;
    0 evaluates the prompt only. `thinking: {"type": "enabled", "budget_tokens": N}` sets the budget.
    `session_key` (the x-session-id header) picks the slot before `metadata.user_id` does.

    >>> parse_anthropic({"max_tokens": 8, "system": "be brief", "messages": [{"role": "user", "content": "hi"}]}).messages[0]
    {'role': 'system', 'content': 'be brief'}
    """
    body = _body(body)
    refuse_unsupported(body, "anthropic")
    if body.get("max_tokens") is None:
        raise RequestError("max_tokens", "is required")
    req: dict = {"dialect": "anthropic", "max_tokens": check_int(body["max_tokens"], "max_tokens", minimum=0)}
    messages = _anthropic_messages(body.get("messages"))
    prefix = _prefix(body.get("assistant_prefix"), "assistant_prefix")
    if messages[-1]["role"] == "assistant" and len(messages) > 1:
        last = messages.pop()
        if last.get("tool_calls"):
            raise RequestError(f"messages[{len(body['messages']) - 1}].content",
                               "a trailing assistant message (prefill) must be text")
        if prefix is not None and last["content"]:
            raise RequestError("assistant_prefix", "cannot be combined with a trailing assistant message")
        prefix = prefix or last["content"] or None
    system = body.get("system")
    if system is not None:
        messages.insert(0, {"role": "system", "content": _anthropic_text(system, "system")})
    req["messages"] = messages
    req["assistant_prefix"] = prefix
    req["model"] = _str(body["model"], "model") if body.get("model") is not None else None
    if body.get("stream") is not None:
        req["stream"] = _bool(body["stream"], "stream")
    _sampling(body, req)
    if "temperature" in req:
        req["temperature"] = _temperature(body["temperature"], 1.0)
    budget = SchemaBudget()  # one request's schemas share the size limits
    req["tools"] = _anthropic_tools(body.get("tools"), budget)
    req["response_format"] = _response_format(body.get("response_format"), budget=budget)
    thinking = body.get("thinking")
    if thinking is not None:
        thinking = _dict(thinking, "thinking")
        kind = thinking.get("type")
        if kind == "enabled":
            req["enable_thinking"] = True
            if thinking.get("budget_tokens") is not None:
                req["thinking_budget"] = check_int(thinking["budget_tokens"], "thinking.budget_tokens", minimum=1)
        elif kind == "disabled":
            req["enable_thinking"] = False
        else:
            raise RequestError("thinking.type", f"must be 'enabled' or 'disabled', got {kind!r}")
    req["stop"] = _stop_sequences(body.get("stop_sequences"), "stop_sequences", allow_str=False)
    req["features"] = _features(body, "anthropic", req, session_key, budget)
    return ChatRequest(**req)
