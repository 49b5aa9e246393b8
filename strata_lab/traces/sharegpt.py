"""ShareGPT-style conversations, a JSON array streamed item by item or one conversation per line, expanded into
one cumulative request per assistant turn: the prompt is every turn before it, the reply the turn itself.

- ``{"id", "conversations": [{"from": "human"|"gpt"|"system"|"function_call"|"observation", "value"}],
  "system", "tools"}`` (LLaMA-Factory's tool variant: a ``function_call`` turn is an assistant tool call whose
  value is ``{"name", "arguments"}`` JSON, an ``observation`` turn its result; ``tools`` a JSON list of
  function definitions);
- ``{"messages": [{"role", "content", "tool_calls"?}], "tools"}`` (the role/content variant, OpenAI
  fine-tuning files).
"""
from __future__ import annotations

import json
from typing import Iterator

from strata_lab.traces.log_calls import new_call, tool_call
from strata_lab.traces.source import Source

NAME = "sharegpt"
SESSION_KEY = True  # --session-key names a field of each record
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
          "bing": "assistant", "bard": "assistant", "model": "assistant", "system": "system",
          "function_call": "tool_call", "tool_call": "tool_call", "observation": "tool", "tool": "tool",
          "function": "tool", "ipython": "tool"}


def detect(first: dict) -> bool:
    if isinstance(first.get("conversations"), list):
        return True
    msgs = first.get("messages")
    # the role/content variant: whole conversations (ending in the assistant's turn), no request fields
    return isinstance(msgs, list) and bool(msgs) and isinstance(msgs[-1], dict) \
        and msgs[-1].get("role") in ("assistant", "gpt") and "model" not in first and "max_tokens" not in first


def _tools(raw, notes: list) -> list | None:
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw.strip() else None
        except json.JSONDecodeError:
            notes.append("tools field is not JSON: dropped")
            return None
    if not isinstance(raw, list):
        return None
    out = [t if "function" in t else {"type": "function", "function": t} for t in raw if isinstance(t, dict)]
    return out or None


def _tool_call(value, n: int) -> dict:
    data = json.loads(value) if isinstance(value, str) else value
    if not isinstance(data, dict) or "name" not in data:
        raise ValueError("a function_call turn must hold {\"name\", \"arguments\"}")
    args = data.get("arguments", data.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            pass
    return tool_call(data.get("id") or f"call_{n}", data["name"], args)


def expand(conv: dict, src: Source, lineno: int) -> Iterator[dict]:
    if not isinstance(conv, dict):
        src.skip(lineno, "conversation is not an object")
        return
    if isinstance(conv.get("messages"), list) and not isinstance(conv.get("conversations"), list):
        yield from _expand_messages(conv, src, lineno)
        return
    turns = conv.get("conversations")
    if not isinstance(turns, list):
        src.skip(lineno, "conversation without a 'conversations' list")
        return
    sid = (src.session_of(conv) if src.session_key else None) or str(conv.get("id") or f"{src.path}:{lineno}")
    notes: list = []
    tools = _tools(conv.get("tools"), notes)
    messages: list = []
    if isinstance(conv.get("system"), str) and conv["system"]:
        messages.append({"role": "system", "content": conv["system"]})
    pending: list = []  # tool calls whose results come next
    n_calls = 0
    from strata_lab.limits import limit

    max_chars = limit("text_chars")
    for i, t in enumerate(turns):
        role = _ROLES.get(str(t.get("from", t.get("role", ""))).lower()) if isinstance(t, dict) else None
        text = t.get("value", t.get("content")) if isinstance(t, dict) else None
        if role is None or not isinstance(text, str):
            src.skip(lineno, f"conversation {sid!r} turn {i}: unknown speaker or no text")
            return
        if len(text) > max_chars:   # before it is rendered and tokenized (strata_lab.limits)
            src.skip(lineno, f"conversation {sid!r} turn {i}: {len(text)} characters, over the limit of {max_chars} "
                             "(text_chars; set STRATA_LIMIT_TEXT_CHARS to change it)")
            return
        tc = None
        if role == "tool_call":
            try:
                tc = _tool_call(text, n_calls)
            except (ValueError, json.JSONDecodeError) as exc:
                src.skip(lineno, f"conversation {sid!r} turn {i}: {exc}")
                return
            n_calls += 1
        if role in ("assistant", "tool_call") and messages:
            call = new_call(format=NAME, fidelity="messages", session=sid, source=src.where(lineno),
                            model=conv.get("model"), messages=list(messages), tools=tools, notes=list(notes))
            if tc is not None:
                call["response_text"], call["response_tool_calls"] = "", [tc]
            else:
                call["response_text"] = text
            yield call
        if tc is not None:
            messages.append({"role": "assistant", "content": "", "tool_calls": [tc]})
            pending.append(tc.get("id"))
        elif role == "tool":
            messages.append({"role": "tool", "tool_call_id": str(pending.pop(0) if pending else "call"),
                             "content": text})
        else:
            messages.append({"role": role, "content": text})


def _expand_messages(conv: dict, src: Source, lineno: int) -> Iterator[dict]:
    from strata_lab.traces.openai import convert_messages

    sid = (src.session_of(conv) if src.session_key else None) or str(conv.get("id") or f"{src.path}:{lineno}")
    notes: list = []
    tools = _tools(conv.get("tools"), notes)
    raw = [dict(m, role="assistant") if isinstance(m, dict) and m.get("role") == "gpt" else m
           for m in conv["messages"]]
    try:
        msgs = convert_messages(raw, notes)
    except ValueError as exc:
        src.skip(lineno, f"conversation {sid!r}: {exc}")
        return
    for i, m in enumerate(msgs):
        if m["role"] == "assistant" and i:
            content = m.get("content")
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content)
            yield new_call(format=NAME, fidelity="messages", session=sid, source=src.where(lineno),
                           model=conv.get("model"), messages=msgs[:i], tools=tools, notes=list(notes),
                           response_text=content or "", response_reasoning=m.get("reasoning_content"),
                           response_tool_calls=m.get("tool_calls"))


def read(src: Source) -> Iterator[dict]:
    if src.head(4096).lstrip().startswith(b"["):
        items = src.array_items()
    else:
        items = src.json_lines()
    for lineno, conv in items:
        try:
            yield from expand(conv, src, lineno)
        except RecursionError:  # a conversation nested past the stack: skipped, named
            src.skip(lineno, "nested too deeply")
