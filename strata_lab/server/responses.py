"""The OpenAI Responses API: `POST /v1/responses` (and `GET /v1/responses/{id}`).

A Responses body (input text or items, instructions, function tools, `previous_response_id`, text format)
is checked with the Responses API's own field names and turned into the chat request the rest of the
server runs (request.parse_openai on an equivalent chat body). The output is built by one class,
`ResponsesBuilder`, from the runner's events in order: the stream sends its events as they come, and the
non-streamed body is the same builder fed the same events at once, so both carry the same items, ids and
usage.

`previous_response_id` chains in memory: each stored response keeps its conversation (input and output,
without `instructions`, which do not carry over). The store (`ResponseStore`) belongs to no one: each
response is held for the API key that made it only, for a time, and within a count and a byte budget.

>>> req, conv = parse_responses({"input": "hi", "instructions": "be brief", "max_output_tokens": 5})
>>> [m["role"] for m in req.messages], req.max_tokens, conv
(['system', 'user'], 5, [{'role': 'user', 'content': 'hi'}])

Why one module: the Responses body's checks, the per-key store and `ResponsesBuilder` are one API's
shape; the store's ownership rules are read beside the routes that use them.
"""
from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from typing import Any

from strata_lab.server.dialects import new_id
from strata_lab.server.errors import RequestError
from strata_lab.server.request import ChatRequest, _kind, check_int, parse_openai
from strata_lab.server.unsupported import refuse_unsupported

__all__ = ["parse_responses", "ResponsesBuilder", "ResponseStore", "RESPONSES_REFUSED"]

_PASS = ("temperature", "top_p", "top_k", "min_p", "seed", "stream", "user", "enable_thinking", "thinking_budget",
         "frequency_penalty", "presence_penalty", "repetition_penalty", "repeat_penalty", "repeat_last_n",
         "logit_bias", "stop", "ignore_eos", "parallel_tool_calls",
         # vLLM's and SGLang's extra fields (features.py CONSTRAINT_FIELDS, controls.py), as on chat
         "grammar", "json_schema", "guided_json", "guided_regex", "guided_choice", "guided_grammar", "regex", "ebnf",
         "structured_outputs", "stop_token_ids", "min_tokens", "min_new_tokens", "include_stop_str_in_output",
         "no_stop_trim", "allowed_token_ids", "bad_words", "truncate_prompt_tokens", "separate_reasoning")

# Responses fields that are refused (a 400 naming them) unless they hold the value shown to be harmless.
RESPONSES_REFUSED: tuple = (
    ("background", lambda v: v not in (None, False), "background responses are not supported"),
    ("conversation", lambda v: v is not None, "conversations objects are not supported: use previous_response_id"),
    ("prompt", lambda v: v is not None, "stored prompt templates are not supported"),
    ("include", lambda v: v not in (None, []), "no extra output data (include) is supported"),
    ("truncation", lambda v: v not in (None, "disabled"), "only truncation 'disabled' is supported"),
    ("max_tool_calls", lambda v: v is not None, "max_tool_calls is not supported"),
    ("top_logprobs", lambda v: v not in (None, 0), "logprobs are not supported on /v1/responses"),
    ("n", lambda v: v not in (None, 1), "one output per response (a Response has no choices): n is 1 only"),
    ("reasoning", lambda v: v not in (None, {}) and not (isinstance(v, dict) and v.get("effort") in (None, "none")
                                                         and v.get("summary") is None),
     "reasoning effort levels are not supported: thinking is on or off (enable_thinking, or effort 'none')"),
)


# OpenAI's bounds on `metadata`: 16 pairs, keys of at most 64 characters, string values of at most 512.
METADATA_PAIRS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512


class ResponseStore:
    """Stored responses: id -> (conversation messages, response body), in memory, each for one API key.

    An entry belongs to the key that made it (`owner`: the key's name; None when the server needs no key):
    `get` by another owner answers None, exactly as for an id never held. Entries expire `ttl` seconds after
    they were stored; at most `max_entries` are held and at most `max_bytes` of their JSON (conversation and
    body, metadata included: the entries are kept as that JSON, so the bytes counted are the bytes held),
    the oldest dropped first. One entry larger than `max_bytes` is not held at all (`put` answers False).

    >>> store = ResponseStore(max_entries=2)
    >>> store.put("r1", [], {"id": "r1"}, owner="alice")
    True
    >>> store.get("r1", owner="alice")[1], store.get("r1", owner="bob"), store.get("r1")
    ({'id': 'r1'}, None, None)
    """

    def __init__(self, max_entries: int = 256, max_bytes: int = 64 << 20, ttl: float = 3600.0, clock=None):
        if max_entries < 0 or max_bytes < 0 or not ttl > 0:
            raise ValueError(f"max_entries and max_bytes must be >= 0 and ttl > 0, got {max_entries}, "
                             f"{max_bytes}, {ttl}")
        self.max_entries, self.max_bytes, self.ttl = max_entries, max_bytes, ttl
        self._clock = clock or time.monotonic
        self._items: OrderedDict[str, tuple[str | None, float, bytes]] = OrderedDict()  # oldest first
        self.bytes = 0
        self._lock = threading.Lock()

    def put(self, response_id: str, conversation: list, body: dict, owner: str | None = None) -> bool:
        raw = json.dumps([conversation, body], ensure_ascii=False, separators=(",", ":")).encode("utf-8",
                                                                                                   "surrogatepass")
        with self._lock:
            self._drop(response_id)
            if self.max_entries == 0 or len(raw) > self.max_bytes:
                return False
            self._items[response_id] = (owner, self._clock() + self.ttl, raw)
            self.bytes += len(raw)
            while len(self._items) > self.max_entries or self.bytes > self.max_bytes:
                self._drop(next(iter(self._items)))
            return True

    def get(self, response_id: str, owner: str | None = None) -> tuple[list, dict] | None:
        with self._lock:
            self._expire()
            entry = self._items.get(response_id)
            if entry is None or entry[0] != owner:
                return None
            conversation, body = json.loads(entry[2])
            return conversation, body

    def _drop(self, response_id: str) -> None:
        entry = self._items.pop(response_id, None)
        if entry is not None:
            self.bytes -= len(entry[2])

    def _expire(self) -> None:
        now = self._clock()
        while self._items:
            rid, (_, until, _) = next(iter(self._items.items()))
            if until > now:  # stored in order, each with the same ttl: the rest expire later
                return
            self._drop(rid)

    def __len__(self) -> int:
        with self._lock:
            self._expire()
            return len(self._items)


# --- request ----------------------------------------------------------------------------------------
def _text(content: Any, name: str, kinds: tuple[str, ...]) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError(name, f"must be a string or an array of content parts, got {_kind(content)}")
    out = []
    for i, part in enumerate(content):
        if not isinstance(part, dict):
            raise RequestError(f"{name}[{i}]", f"must be an object, got {_kind(part)}")
        if part.get("type") not in kinds:
            raise RequestError(f"{name}[{i}].type", f"only {', '.join(kinds)} parts are supported, got "
                               f"{part.get('type')!r}")
        if not isinstance(part.get("text"), str):
            raise RequestError(f"{name}[{i}].text", "must be a string")
        out.append(part["text"])
    return "".join(out)


def _input_messages(value: Any) -> list[dict]:
    """Responses input (a string or items) as chat messages (OpenAI shape, what the template renders)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise RequestError("input", "must be a string or a non-empty array of input items")
    messages: list[dict] = []
    reasoning: list[str] = []

    def assistant() -> dict:
        if not messages or messages[-1]["role"] != "assistant" or messages[-1].get("_closed"):
            messages.append({"role": "assistant", "content": ""})
        return messages[-1]

    for i, item in enumerate(value):
        name = f"input[{i}]"
        if not isinstance(item, dict):
            raise RequestError(name, f"must be an object, got {_kind(item)}")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise RequestError(f"{name}.role", f"must be user, system, developer or assistant, got {role!r}")
            if role == "assistant":
                text = _text(item.get("content"), f"{name}.content", ("output_text", "input_text", "refusal"))
                msg = assistant()
                if msg.get("tool_calls"):  # text after a call starts a new turn
                    msg["_closed"] = True
                    msg = assistant()
                msg["content"] += text
            else:
                text = _text(item.get("content"), f"{name}.content", ("input_text",))
                messages.append({"role": "system" if role == "developer" else role, "content": text})
        elif kind == "function_call":
            for key in ("call_id", "name", "arguments"):
                if not isinstance(item.get(key), str):
                    raise RequestError(f"{name}.{key}", "must be a string")
            assistant().setdefault("tool_calls", []).append(
                {"id": item["call_id"], "type": "function",
                 "function": {"name": item["name"], "arguments": item["arguments"]}})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise RequestError(f"{name}.call_id", "must be a string")
            output = _text(item.get("output"), f"{name}.output", ("input_text", "output_text"))
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            reasoning.append(_text(parts, f"{name}.content", ("reasoning_text", "summary_text")))
            assistant()["reasoning_content"] = "".join(reasoning)
            reasoning = []
        else:
            raise RequestError(f"{name}.type", "must be message, function_call, function_call_output or "
                               f"reasoning, got {kind!r}")
    for m in messages:
        m.pop("_closed", None)
    return messages


def _tools(value: Any) -> list[dict] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise RequestError("tools", f"must be an array, got {_kind(value)}")
    out = []
    for i, tool in enumerate(value):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise RequestError(f"tools[{i}].type", "only function tools are supported, got "
                               f"{tool.get('type') if isinstance(tool, dict) else _kind(tool)!r}")
        fn = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(value: Any) -> Any:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and value.get("type") == "function":
        return {"type": "function", "function": {"name": value.get("name")}}
    raise RequestError("tool_choice", "must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...}")


def _text_format(value: Any) -> dict | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise RequestError("text", f"must be an object, got {_kind(value)}")
    fmt = value.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise RequestError("text.format", f"must be an object, got {_kind(fmt)}")
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name", "response"),
                                                       "schema": fmt.get("schema", {})}}
    return {k: v for k, v in fmt.items() if k in ("type", "schema")}


def parse_responses(body: Any, *, prior: list | None = None,
                    session_key: str | None = None) -> tuple[ChatRequest, list[dict]]:
    """(the chat request to run, the conversation so far without instructions) for a Responses body;
    `prior` is the stored conversation of `previous_response_id`."""
    if not isinstance(body, dict):
        raise RequestError("body", f"must be a JSON object, got {_kind(body)}")
    for name, refused, why in RESPONSES_REFUSED:
        if name in body and refused(body[name]):
            raise RequestError(name, f"is not supported by this server: {why}", code="unsupported_parameter")
    refuse_unsupported(body, "openai")  # the chat route's refusals hold here too (llama.cpp sampler fields, ...)
    if body.get("input") is None:
        raise RequestError("input", "is required")
    conversation = list(prior or []) + _input_messages(body["input"])
    messages = list(conversation)
    if body.get("instructions") is not None:
        if not isinstance(body["instructions"], str):
            raise RequestError("instructions", f"must be a string, got {_kind(body['instructions'])}")
        messages.insert(0, {"role": "system", "content": body["instructions"]})
    chat: dict = {"messages": messages}
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = check_int(body["max_output_tokens"], "max_output_tokens", minimum=1)
    for name in _PASS:
        if body.get(name) is not None:
            chat[name] = body[name]
    if body.get("model") is not None:
        chat["model"] = body["model"]
    tools = _tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    fmt = _text_format(body.get("text"))
    if fmt is not None:
        chat["response_format"] = fmt
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort") == "none":
        chat["enable_thinking"] = False
    try:
        req = parse_openai(chat, session_key=session_key)
    except RequestError as exc:  # name the Responses field the client sent
        field = exc.field or ""
        for ours, theirs in (("max_tokens", "max_output_tokens"), ("response_format", "text.format"),
                             ("tools[", "tools["), ("messages", "input")):
            if field.startswith(ours):
                field = theirs + field[len(ours):]
                break
        raw = exc.message[len(exc.field) + 2:] if exc.field else exc.message
        raise RequestError(field or None, raw, code=exc.code, status=exc.status) from None
    if body.get("store") is not None and not isinstance(body["store"], bool):
        raise RequestError("store", f"must be a boolean, got {_kind(body['store'])}")
    _check_metadata(body.get("metadata"))
    return req, conversation


def _check_metadata(value: Any) -> None:
    """OpenAI's `metadata`: at most 16 pairs of a key of at most 64 characters and a string of at most 512
    (the response is stored with it, so its size is bounded like the rest of the body)."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise RequestError("metadata", f"must be an object, got {_kind(value)}")
    if len(value) > METADATA_PAIRS:
        raise RequestError("metadata", f"holds at most {METADATA_PAIRS} pairs, got {len(value)}")
    for key, item in value.items():
        if len(key) > METADATA_KEY_CHARS:
            raise RequestError("metadata", f"keys are at most {METADATA_KEY_CHARS} characters, got one of "
                               f"{len(key)}")
        if not isinstance(item, str):
            raise RequestError(f"metadata.{key}", f"must be a string, got {_kind(item)}")
        if len(item) > METADATA_VALUE_CHARS:
            raise RequestError(f"metadata.{key}", f"must be at most {METADATA_VALUE_CHARS} characters, got "
                               f"{len(item)}")


# --- response ---------------------------------------------------------------------------------------
def _dumps(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


class ResponsesBuilder:
    """Output items from the runner's events, as stream events and as the final Response body.

    `start()`, then `event(ev)` per output Event, then `done(summary)`: each returns SSE frames. `body()`
    is the Response object at any point (the final one after `done`). Non-streamed responses use the same
    calls on `summary.events` (`whole`).
    """

    def __init__(self, request_id: str, model: str, prompt_tokens: int, *, include_usage: bool = True,
                 cached_tokens: int = 0, body: dict | None = None, previous_id: str | None = None,
                 on_done=None):
        self.id, self.model, self.created = request_id, model, int(time.time())
        self.request = body or {}
        self.previous_id = previous_id
        self.on_done = on_done            # on_done(response body): store it for previous_response_id
        self.output: list[dict] = []
        self.open: dict | None = None     # the open reasoning or message item
        self.seq = 0
        self.status = "in_progress"
        self.usage = None
        self.incomplete = None
        self.extra: dict = {}

    # -- the Response object
    def body(self) -> dict:
        r = self.request
        tools = [t for t in r.get("tools") or []]
        out = {"id": self.id, "object": "response", "created_at": self.created, "status": self.status,
               "model": self.model, "output": [dict(item) for item in self.output], "error": None,
               "incomplete_details": self.incomplete, "instructions": r.get("instructions"),
               "max_output_tokens": r.get("max_output_tokens"), "metadata": r.get("metadata") or {},
               "parallel_tool_calls": r.get("parallel_tool_calls", True), "previous_response_id": self.previous_id,
               "temperature": r.get("temperature", 1.0), "top_p": r.get("top_p", 1.0),
               "tool_choice": r.get("tool_choice", "auto"), "tools": tools,
               "text": r.get("text") or {"format": {"type": "text"}}, "truncation": "disabled",
               "store": r.get("store", True), "usage": self.usage, **self.extra}
        return out

    def _frame(self, kind: str, **fields) -> str:
        payload = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\ndata: {_dumps(payload)}\n\n"

    # -- stream
    def start(self) -> list[str]:
        return [self._frame("response.created", response=self.body()),
                self._frame("response.in_progress", response=self.body())]

    def _close(self) -> list[str]:
        item, self.open = self.open, None
        if item is None:
            return []
        index = self.output.index(item)
        frames = []
        if item["type"] == "message":
            part = item["content"][0]
            frames += [self._frame("response.output_text.done", item_id=item["id"], output_index=index,
                                   content_index=0, text=part["text"], logprobs=[]),
                       self._frame("response.content_part.done", item_id=item["id"], output_index=index,
                                   content_index=0, part=dict(part))]
        else:
            part = item["content"][0]
            frames.append(self._frame("response.reasoning_text.done", item_id=item["id"], output_index=index,
                                      content_index=0, text=part["text"]))
        item["status"] = "completed"
        frames.append(self._frame("response.output_item.done", output_index=index, item=_copy(item)))
        return frames

    def _open(self, kind: str) -> list[str]:
        frames = self._close()
        if kind == "message":
            item = {"type": "message", "id": new_id("msg_"), "status": "in_progress", "role": "assistant",
                    "content": [{"type": "output_text", "text": "", "annotations": [], "logprobs": []}]}
        else:
            item = {"type": "reasoning", "id": new_id("rs_"), "status": "in_progress", "summary": [],
                    "content": [{"type": "reasoning_text", "text": ""}]}
        self.output.append(item)
        self.open = item
        index = len(self.output) - 1
        frames.append(self._frame("response.output_item.added", output_index=index, item=_copy(item)))
        if kind == "message":
            frames.append(self._frame("response.content_part.added", item_id=item["id"], output_index=index,
                                      content_index=0, part=dict(item["content"][0], text="")))
        return frames

    def event(self, ev) -> list[str]:
        if ev.kind == "tool_call":
            frames = self._close()
            args = json.dumps(ev.call.arguments, ensure_ascii=False)
            item = {"type": "function_call", "id": new_id("fc_"), "call_id": new_id("call_"), "name": ev.call.name,
                    "arguments": "", "status": "in_progress"}
            self.output.append(item)
            index = len(self.output) - 1
            frames.append(self._frame("response.output_item.added", output_index=index, item=_copy(item)))
            item["arguments"] = args
            frames.append(self._frame("response.function_call_arguments.delta", item_id=item["id"],
                                      output_index=index, delta=args))
            frames.append(self._frame("response.function_call_arguments.done", item_id=item["id"],
                                      output_index=index, arguments=args, name=item["name"]))
            item["status"] = "completed"
            frames.append(self._frame("response.output_item.done", output_index=index, item=_copy(item)))
            return frames
        kind = "reasoning" if ev.kind == "reasoning" else "message"
        frames = [] if self.open is not None and self.open["type"] == kind else self._open(kind)
        item = self.open
        item["content"][0]["text"] += ev.text
        index = len(self.output) - 1
        name = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra = {} if kind == "reasoning" else {"logprobs": []}
        frames.append(self._frame(name, item_id=item["id"], output_index=index, content_index=0, delta=ev.text,
                                  **extra))
        return frames

    def done(self, summary) -> list[str]:
        frames = self._close()
        self.usage = {"input_tokens": summary.prompt_tokens,
                      "input_tokens_details": {"cached_tokens": summary.cached_tokens},
                      "output_tokens": summary.completion_tokens,
                      "output_tokens_details": {"reasoning_tokens": summary.reasoning_tokens},
                      "total_tokens": summary.prompt_tokens + summary.completion_tokens}
        if summary.finish == "length":
            self.status, self.incomplete = "incomplete", {"reason": "max_output_tokens"}
        else:
            self.status = "completed"
        self.extra = {"seed": summary.seed, "timings": summary.timings()}
        final = self.body()
        if self.on_done is not None:
            self.on_done(final)
        # one closing event for both ends (status "incomplete" at max_output_tokens): the SDK's stream helpers
        # finish on response.completed only, as llama.cpp's server sends it
        return frames + [self._frame("response.completed", response=final)]

    def error(self, err: RequestError) -> list[str]:
        self.status = "failed"
        return self._close() + [
            self._frame("error", code=err.code, message=str(err), param=err.field),
            self._frame("response.failed", response={**self.body(), "error": {"code": err.code,
                                                                                 "message": str(err)}})]

    def whole(self, summary) -> dict:
        """The non-streamed Response: the same calls a stream makes, on the summary's events."""
        self.start()
        for ev in summary.events:
            self.event(ev)
        self.done(summary)
        return self.body()


def _copy(item: dict) -> dict:
    return json.loads(json.dumps(item))


def output_messages(body: dict) -> list[dict]:
    """A Response's output as chat messages, for the next turn's conversation."""
    msg: dict = {"role": "assistant", "content": ""}
    for item in body["output"]:
        if item["type"] == "reasoning":
            msg["reasoning_content"] = item["content"][0]["text"]
        elif item["type"] == "message":
            msg["content"] += item["content"][0]["text"]
        elif item["type"] == "function_call":
            msg.setdefault("tool_calls", []).append({"id": item["call_id"], "type": "function",
                                                     "function": {"name": item["name"],
                                                                  "arguments": item["arguments"]}})
    return [msg]
