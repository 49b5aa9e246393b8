"""OpenAI Responses API logs: one JSON per line holding a request body (``{"model", "input", "instructions",
"tools", "previous_response_id"}``) or a ``{"request", "response"}`` pair whose response is a Responses object
(``{"id", "object": "response", "output": [...], "usage": {"input_tokens", "input_tokens_details":
{"cached_tokens"}, "output_tokens"}}``). Input and output items (``message`` with ``input_text`` /
``output_text`` parts, ``function_call``, ``function_call_output``, ``reasoning``) become chat messages by the
conversion Codex rollouts use (`strata_lab.traces.codex.convert_items`).

A request that names ``previous_response_id`` sends only its new items: its prompt is the earlier request's
conversation, that response's output and the new items (the server's stored state), when the earlier pair is
in the log (else noted: the earlier turns are missing). ``instructions`` is the system prompt (it is not
carried over from the previous response, as the API documents). Sessions: ``session`` / ``session_id`` /
``metadata.session_id`` / ``prompt_cache_key`` (`--session-key` overrides), else the session of the
previous response, else prefix-chaining (`log_calls.CHAINING_RULE`).

>>> call = from_request({"model": "m", "instructions": "Be brief.", "input": "hi"},
...                     {"id": "resp_1", "object": "response", "output": [{"type": "message", "role": "assistant",
...                      "content": [{"type": "output_text", "text": "hello"}]}],
...                      "usage": {"input_tokens": 12, "input_tokens_details": {"cached_tokens": 0},
...                                "output_tokens": 2}})
>>> call["system"], call["messages"], call["response_text"], call["prompt_tokens"], call["cached_tokens"]
('Be brief.', [{'role': 'user', 'content': 'hi'}], 'hello', 12, 0)
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Iterator

from strata_lab.traces.codex import convert_items
from strata_lab.traces.dialect import http_error
from strata_lab.traces.log_calls import SessionChain, new_call
from strata_lab.traces.source import Source

NAME = "openai-responses"
SESSION_KEY = True  # --session-key names a field of each record
MAX_STORED = 4096  # responses remembered for previous_response_id (the most recent)


def _body(rec: dict) -> dict:
    return rec["request"] if isinstance(rec.get("request"), dict) else rec


def detect(first: dict) -> bool:
    body = _body(first)
    if "messages" in body or not isinstance(body.get("input"), (list, str)):
        return False
    return "model" in body or "instructions" in body or "previous_response_id" in body \
        or isinstance(first.get("response"), dict) and first["response"].get("object") == "response"


def _tools(tools, notes: list) -> list[dict] | None:
    """Responses function tools (``{"type": "function", "name", "parameters"}``) in the chat shape."""
    out = []
    for t in tools or ():
        if not isinstance(t, dict):
            continue
        if t.get("type") == "function":
            fn = {k: t[k] for k in ("name", "description", "parameters") if t.get(k) is not None}
            out.append({"type": "function", "function": fn})
        elif "hosted tools (not rendered)" not in notes:
            notes.append("hosted tools (not rendered)")  # web_search, file_search, ...: defined by the API
    return out or None


def from_request(body: dict, response: dict | None = None, *, prior: list | None = None) -> dict:
    """One call from a Responses request body (and its response). `prior`: the conversation before this
    request's ``input`` (the stored state of its ``previous_response_id``)."""
    notes: list = []
    raw = body.get("input")
    if isinstance(raw, str):
        raw = [{"type": "message", "role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise ValueError("input: missing or empty")
    messages = list(prior or ()) + convert_items(raw, notes)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ValueError(f"instructions: must be a string, got {type(instructions).__name__}")
    call = new_call(format=NAME, fidelity="messages", model=body.get("model"), system=instructions or None,
                    messages=messages, tools=_tools(body.get("tools"), notes), notes=notes)
    if isinstance(response, dict):
        apply_response(call, response)
    return call


def apply_response(call: dict, response: dict) -> None:
    """The reply (text, reasoning, tool calls) and usage of a Responses object."""
    out = response.get("output")
    if isinstance(out, list) and out:
        reply = convert_items(out, call["notes"])
        call["response_text"] = "".join(m.get("content") or "" for m in reply if m["role"] == "assistant")
        call["response_reasoning"] = "".join(m.get("reasoning_content", "") for m in reply) or None
        call["response_tool_calls"] = [c for m in reply for c in m.get("tool_calls", ())] or None
    call["finish"] = response.get("status")
    call["model"] = response.get("model") or call["model"]
    call["request_id"] = response.get("id")
    usage = response.get("usage") or {}
    call["prompt_tokens"] = usage.get("input_tokens")
    call["completion_tokens"] = usage.get("output_tokens")
    call["cached_tokens"] = (usage.get("input_tokens_details") or {}).get("cached_tokens")


def _reply_message(call: dict) -> dict | None:
    if call["response_text"] is None and not call["response_tool_calls"]:
        return None
    m = {"role": "assistant", "content": call["response_text"] or ""}
    if call["response_reasoning"]:
        m["reasoning_content"] = call["response_reasoning"]
    if call["response_tool_calls"]:
        m["tool_calls"] = call["response_tool_calls"]
    return m


def read(src: Source) -> Iterator[dict]:
    chain = SessionChain(src.stem)
    stored: OrderedDict = OrderedDict()  # response id -> (conversation after it, session)
    for lineno, rec in src.json_lines():
        body = _body(rec)
        response = rec.get("response") if body is not rec else None
        refused = http_error(response)  # an HTTP status >= 400 or an error object (a failed response)
        if refused is not None:
            src.skip(lineno, f"{refused}: not a model call")
            continue
        prev = body.get("previous_response_id")
        before = stored.get(prev) if isinstance(prev, str) else None
        try:
            call = from_request(body, response, prior=before[0] if before else None)
        except ValueError as exc:
            src.skip(lineno, str(exc))
            continue
        if isinstance(prev, str) and before is None:
            call["notes"].append("previous_response_id not in the log: the earlier turns are missing")
        call["source"] = src.where(lineno)
        ts = rec.get("ts") or rec.get("timestamp") or (response or {}).get("created_at")
        call["ts"] = float(ts) if isinstance(ts, (int, float)) else None
        reply = _reply_message(call)
        sid = src.session_of(rec) if src.session_key else \
            rec.get("session") or rec.get("session_id") or (body.get("metadata") or {}).get("session_id") \
            or body.get("prompt_cache_key")
        if sid:
            call["session"] = str(sid)
        elif before is not None:
            call["session"] = before[1]
        else:
            lead = [{"role": "system", "content": call["system"]}] if call["system"] else []
            call["session"] = chain.session_of_messages(lead + call["messages"], reply)
        if call["request_id"]:
            stored[call["request_id"]] = (call["messages"] + ([reply] if reply else []), call["session"])
            if len(stored) > MAX_STORED:
                stored.popitem(last=False)
        yield call
