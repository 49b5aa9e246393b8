"""OpenAI chat-completions logs: one JSON per line holding a request body, ``{"request", "response"}`` pairs, or
Batch API input lines (``{"custom_id", "method", "url", "body"}``). A response with vLLM's
``prompt_token_ids`` / ``choices[].token_ids`` (``return_token_ids``) gives the call its ids.

>>> call = from_request({"model": "m", "messages": [{"role": "user", "content": "hi"}]},
...                     {"choices": [{"message": {"content": "hello"}, "finish_reason": "stop"}],
...                      "usage": {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 0}}})
>>> call["response_text"], call["prompt_tokens"], call["cached_tokens"], call["fidelity"]
('hello', 9, 0, 'messages')
"""
from __future__ import annotations

from typing import Iterator

from strata_lab.traces.log_calls import SessionChain, new_call, text_parts, tool_call
from strata_lab.traces.dialect import http_error, looks_anthropic
from strata_lab.traces.source import Source

NAME = "openai"
SESSION_KEY = True  # --session-key names a field of each record
_ROLES = {"developer": "system", "function": "tool"}


def detect(first: dict) -> bool:
    body = first.get("body") if isinstance(first.get("body"), dict) else first.get("request", first)
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return False
    return not looks_anthropic(body, first.get("response"))


def convert_messages(messages: list, notes: list) -> list[dict]:
    """Wire messages into the internal shape (OpenAI's, text parts only, reasoning as reasoning_content)."""
    out = []
    for m in messages:
        if not isinstance(m, dict):
            raise ValueError(f"message must be an object, got {type(m).__name__}")
        role = m.get("role")
        content = m.get("content")
        if content.__class__ is str and len(m) <= 3:  # the common shapes, as the general path writes them
            if len(m) == 2 and (role == "user" or role == "system"):
                out.append({"role": role, "content": content})
                continue
            tcid = m.get("tool_call_id")
            if len(m) == 3 and role == "tool" and tcid.__class__ is str and tcid:
                out.append({"role": role, "content": content, "tool_call_id": tcid})
                continue
        role = _ROLES.get(role, role)
        msg = {"role": role}
        content = m.get("content")
        if content is not None and content.__class__ is not str:
            content = text_parts(content, notes)
        if content is not None:
            msg["content"] = content
        elif role != "assistant":
            msg["content"] = ""
        if role == "assistant":
            reasoning = m.get("reasoning_content") or m.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                msg["reasoning_content"] = reasoning
            calls = [tool_call(c.get("id"), (c.get("function") or {}).get("name"),
                               (c.get("function") or {}).get("arguments"))
                     for c in m.get("tool_calls") or () if isinstance(c, dict)]
            if calls:
                msg["tool_calls"] = calls
        if role == "tool":
            msg["tool_call_id"] = str(m.get("tool_call_id") or m.get("name") or "call")
        if isinstance(m.get("name"), str) and role in ("user", "system"):
            msg["name"] = m["name"]
        out.append(msg)
    return out


def apply_response(call: dict, response: dict | None) -> None:
    """Fill a call's reply and reported usage from a chat.completion (or a streamed one, assembled)."""
    if not isinstance(response, dict):
        return
    choices = response.get("choices") or []
    choice = choices[0] if choices and isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    content = message.get("content")
    call["response_text"] = content if isinstance(content, str) else None
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    call["response_reasoning"] = reasoning if isinstance(reasoning, str) else None
    calls = [tool_call(c.get("id"), (c.get("function") or {}).get("name"), (c.get("function") or {}).get("arguments"))
             for c in message.get("tool_calls") or () if isinstance(c, dict)]
    call["response_tool_calls"] = calls or None
    call["finish"] = choice.get("finish_reason")
    call["model"] = response.get("model") or call["model"]
    call["request_id"] = response.get("id") or call["request_id"]
    usage = response.get("usage") or {}
    call["prompt_tokens"] = usage.get("prompt_tokens")
    call["completion_tokens"] = usage.get("completion_tokens")
    details = usage.get("prompt_tokens_details") or {}
    call["cached_tokens"] = details.get("cached_tokens")
    if isinstance(response.get("prompt_token_ids"), list):  # vLLM return_token_ids
        call["prompt_ids"] = response["prompt_token_ids"]
        call["fidelity"] = "ids"
        if isinstance(choice.get("token_ids"), list):
            call["response_ids"] = choice["token_ids"]
    timings = response.get("timings")  # llama.cpp adds its timings to OpenAI responses
    if isinstance(timings, dict) and call["cached_tokens"] is None and isinstance(timings.get("cache_n"), int):
        call["cached_tokens"] = timings["cache_n"]


def from_request(body: dict, response: dict | None = None, *, fmt: str = NAME) -> dict:
    """One call from a chat-completions request body (and its response, if logged)."""
    notes: list = []
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise ValueError("messages: missing or empty")
    call = new_call(format=fmt, fidelity="messages", model=body.get("model"), notes=notes,
                    messages=convert_messages(body["messages"], notes),
                    tools=[t for t in body.get("tools") or () if isinstance(t, dict)] or None)
    kwargs = body.get("chat_template_kwargs")  # vLLM/SGLang: e.g. {"enable_thinking": false}, reaches the template
    if isinstance(kwargs, dict) and kwargs:
        call["extra"] = {"chat_template_kwargs": kwargs}
    apply_response(call, response)
    return call


def read(src: Source) -> Iterator[dict]:
    chain = SessionChain(src.stem)
    for lineno, rec in src.json_lines():
        body, response = rec, None
        batch_out = None
        if isinstance(rec.get("body"), dict) and "custom_id" in rec:  # Batch API input line
            body = rec["body"]
            if src.batch is not None:  # its output line, joined on custom_id
                batch_out = src.batch.pop(str(rec["custom_id"]), None)
                if batch_out is not None and batch_out[0] is None:
                    src.skip(lineno, f"custom_id {rec['custom_id']!r} failed in {batch_out[1]} ({batch_out[2]}): "
                                     "not a model call")
                    continue
                if batch_out is not None:
                    response = batch_out[0]
        elif isinstance(rec.get("request"), dict):
            body, response = rec["request"], rec.get("response")
        elif isinstance(rec.get("response"), dict) and "messages" in rec:
            response = rec["response"]
        refused = http_error(response)
        if refused is not None:
            src.skip(lineno, f"{refused}: not a model call")
            continue
        if isinstance(response, dict) and isinstance(response.get("body"), dict):  # batch output shape
            response = response["body"]
        try:
            call = from_request(body, response)
        except ValueError as exc:
            src.skip(lineno, str(exc))
            continue
        call["source"] = src.where(lineno)
        call["request_id"] = call["request_id"] or rec.get("custom_id")
        if batch_out is not None:
            call["notes"].append(f"usage and reply from {batch_out[1]}")
        elif "custom_id" in rec and src.batch is not None:
            call["notes"].append("no output line for this custom_id")
        ts = rec.get("ts") or rec.get("timestamp") or rec.get("created") or (response or {}).get("created")
        call["ts"] = float(ts) if isinstance(ts, (int, float)) else None
        sid = src.session_of(rec) if src.session_key else \
            rec.get("session") or rec.get("session_id") or (body.get("metadata") or {}).get("session_id")
        call["session"] = str(sid) if sid else chain.session_of_messages(call["messages"], reply_message(call))
        yield call


def reply_message(call: dict) -> dict | None:
    """The call's reply as the next request would resend it (for prefix-chaining)."""
    if call["response_text"] is None and not call["response_tool_calls"]:
        return None
    m = {"role": "assistant", "content": call["response_text"] or ""}
    if call["response_tool_calls"]:
        m["tool_calls"] = call["response_tool_calls"]
    return m
