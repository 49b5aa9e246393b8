"""Anthropic Messages API logs: one JSON per line holding a request body (``system``, ``messages`` with content
blocks, ``tools``), optionally with its response (``{"request", "response"}`` or a ``response`` key). The
``cache_control`` breakpoints are kept (``cache_breakpoints``), thinking becomes reasoning, images a placeholder.

>>> call = from_request({"model": "claude", "system": [{"type": "text", "text": "S", "cache_control":
...     {"type": "ephemeral"}}], "messages": [{"role": "user", "content": "hi"}]},
...     {"content": [{"type": "text", "text": "yo"}], "usage": {"input_tokens": 3,
...      "cache_read_input_tokens": 10, "cache_creation_input_tokens": 0, "output_tokens": 2}})
>>> call["system"], call["cache_breakpoints"], call["prompt_tokens"], call["cache_read_tokens"]
('S', ['system[0]'], 13, 10)
"""
from __future__ import annotations

from typing import Iterator

from strata_lab.traces.log_calls import SessionChain, image_placeholder, new_call, tool_call
from strata_lab.traces.dialect import http_error, looks_anthropic
from strata_lab.traces.openai import reply_message
from strata_lab.traces.source import Source

NAME = "anthropic"
SESSION_KEY = True  # --session-key names a field of each record


def detect(first: dict) -> bool:
    return looks_anthropic(first.get("request", first), first.get("response"))


def _blocks(content) -> list:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content or () if isinstance(b, dict)]


def _result_text(content, notes: list) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for b in _blocks(content):
        if b.get("type") == "text":
            parts.append(b.get("text", ""))
        elif b.get("type") in ("image", "document"):
            parts.append(image_placeholder(notes)["text"])
    return "".join(parts)


def convert_messages(messages: list, notes: list, marks: list | None = None,
                     at: list | None = None, blocks: list | None = None) -> list[dict]:
    """Anthropic messages into the internal shape: tool_use -> tool_calls, tool_result -> tool messages (before
    the user's own text), thinking -> reasoning_content, images -> ``[image]``. Blocks with ``cache_control``
    are named in `marks` (``messages[i].content[j]``) and located in the output in `at` (``["msg", k, what,
    n]``: the end of part n of message k's content, of its tool call n, of its reasoning); `blocks` gets the
    same locator for every block (the content-block ends Anthropic's look-back counts)."""
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise ValueError(f"messages[{i}].role: must be user or assistant")
        parts, calls, reasoning, results = [], [], [], []
        where = []  # (kind, n) of this message's cache_control blocks
        every = []  # (kind, n) of all its blocks
        for j, b in enumerate(_blocks(m.get("content"))):
            kind = b.get("type")
            if kind == "text":
                parts.append({"type": "text", "text": b.get("text", "")})
                spot = ("part", len(parts) - 1)
            elif kind in ("image", "document"):
                parts.append(image_placeholder(notes))
                spot = ("part", len(parts) - 1)
            elif kind == "tool_use":
                calls.append(tool_call(b.get("id"), b.get("name"), b.get("input")))
                spot = ("call", len(calls) - 1)
            elif kind == "tool_result":
                results.append({"role": "tool", "tool_call_id": str(b.get("tool_use_id") or "call"),
                                "content": _result_text(b.get("content"), notes)})
                spot = ("result", len(results) - 1)
            elif kind == "thinking":
                reasoning.append(b.get("thinking", ""))
                spot = ("reasoning", 0)
            else:
                if kind == "redacted_thinking" and "redacted thinking" not in notes:
                    notes.append("redacted thinking")
                spot = None
            if marks is not None and b.get("cache_control"):
                marks.append(f"messages[{i}].content[{j}]")
                where.append(spot)
            every.append(spot)
        for into, spots in ((at, where), (blocks, every)):
            if into is None:
                continue
            for spot in spots:
                if spot is None:
                    continue
                if spot[0] == "result":
                    into.append(["msg", len(out) + spot[1], "content", 0])
                elif spot[0] == "part":
                    into.append(["msg", len(out) + len(results), "content", spot[1]])
                else:
                    into.append(["msg", len(out) + (len(results) if m["role"] == "user" else 0), spot[0], spot[1]])
        if m["role"] == "user":
            out.extend(results)
            if parts or not results:
                out.append({"role": "user", "content": parts if len(parts) != 1 else parts[0]["text"]})
        else:
            msg = {"role": "assistant", "content": parts if len(parts) != 1 else parts[0]["text"]}
            if not parts:
                msg["content"] = ""
            if reasoning:
                msg["reasoning_content"] = "".join(reasoning)
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
    return out


def convert_tools(tools) -> list[dict] | None:
    out = []
    for t in tools or ():
        if isinstance(t, dict) and "name" in t:
            fn = {"name": t["name"]}
            if "description" in t:
                fn["description"] = t["description"]
            fn["parameters"] = t.get("input_schema", {"type": "object", "properties": {}})
            out.append({"type": "function", "function": fn})
    return out or None


def apply_response(call: dict, response: dict | None) -> None:
    """Fill a call's reply and usage from a Messages API response (or an assembled stream)."""
    if not isinstance(response, dict):
        return
    if response.get("type") == "error":
        raise ValueError("error response: not a model call")
    texts, reasoning, calls = [], [], []
    for b in _blocks(response.get("content")):
        if b.get("type") == "text":
            texts.append(b.get("text", ""))
        elif b.get("type") == "thinking":
            reasoning.append(b.get("thinking", ""))
        elif b.get("type") == "tool_use":
            calls.append(tool_call(b.get("id"), b.get("name"), b.get("input")))
    call["response_text"] = "".join(texts)
    call["response_reasoning"] = "".join(reasoning) or None
    call["response_tool_calls"] = calls or None
    call["finish"] = response.get("stop_reason")
    call["model"] = response.get("model") or call["model"]
    call["request_id"] = response.get("id") or call["request_id"]
    apply_usage(call, response.get("usage"))


def apply_usage(call: dict, usage) -> None:
    if not isinstance(usage, dict):
        return
    counts = [usage.get(k) for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")]
    if any(isinstance(c, int) for c in counts):
        # Anthropic's input_tokens counts only what follows the last breakpoint: the prompt is the sum
        call["prompt_tokens"] = sum(c for c in counts if isinstance(c, int))
    call["cache_creation_tokens"] = usage.get("cache_creation_input_tokens")
    call["cache_read_tokens"] = usage.get("cache_read_input_tokens")
    call["cached_tokens"] = usage.get("cache_read_input_tokens")
    call["completion_tokens"] = usage.get("output_tokens")


def from_request(body: dict, response: dict | None = None, *, fmt: str = NAME) -> dict:
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise ValueError("messages: missing or empty")
    notes: list = []
    marks: list = []
    at: list = []  # where each breakpoint ends in the converted call (`Trace` turns these into token positions)
    blocks: list = []  # where every content block ends (the look-back counts blocks)
    system = body.get("system")
    if isinstance(system, list):
        texts, end = [], 0
        for k, b in enumerate(system):
            if not isinstance(b, dict) or b.get("type") != "text":
                continue
            end += (2 if texts else 0) + len(b.get("text", ""))
            texts.append(b.get("text", ""))
            blocks.append(["system", end])
            if b.get("cache_control"):
                marks.append(f"system[{k}]")
                at.append(["system", end])
        system = "\n\n".join(texts)
    elif isinstance(system, str) and system:
        blocks.append(["system", len(system)])
    tools = body.get("tools") or []
    named = 0
    for k, t in enumerate(tools):
        if isinstance(t, dict) and "name" in t:
            if t.get("cache_control"):
                marks.append(f"tools[{k}]")
                at.append(["tool", named])
            named += 1
    messages = convert_messages(body["messages"], notes, marks, at, blocks)
    if isinstance(body.get("cache_control"), dict):
        marks.append("auto")  # automatic mode: one top-level breakpoint that moves to the last block
        at.append(["auto"])
    call = new_call(format=fmt, fidelity="messages", model=body.get("model"), notes=notes,
                    system=system if isinstance(system, str) and system else None, messages=messages,
                    tools=convert_tools(tools), cache_breakpoints=marks)
    call["extra"] = {"cache_at": at, "block_at": blocks}
    apply_response(call, response)
    return call


def session_of(body: dict, rec: dict) -> str | None:
    """A session key the log states: ``session``, or the session id inside ``metadata.user_id`` (Claude Code
    writes ``user_<hash>_account_<uuid>_session_<uuid>``). A plain ``user_id`` names a user, not a session:
    it is only a namespace for prefix-chaining (see `read`)."""
    sid = rec.get("session") or rec.get("session_id")
    if sid:
        return str(sid)
    user = (body.get("metadata") or {}).get("user_id")
    if isinstance(user, str) and "_session_" in user:
        return user.rsplit("_session_", 1)[1] or None
    return None


def chain_session(chains: dict, prefix: str, call: dict, body: dict) -> str:
    """Prefix-chaining for an Anthropic call, within its ``metadata.user_id`` when it has one (one user runs
    many sessions: the user id only keeps users apart)."""
    user = (body.get("metadata") or {}).get("user_id")
    space = f"{prefix}-{user}" if isinstance(user, str) and user else prefix
    chain = chains.get(space)
    if chain is None:
        chain = chains[space] = SessionChain(space)
    head = [{"role": "system", "content": call["system"]}] if call["system"] else []
    return chain.session_of_messages(head + call["messages"], reply_message(call))


def read(src: Source) -> Iterator[dict]:
    chains: dict = {}
    for lineno, rec in src.json_lines():
        body, response = (rec["request"], rec.get("response")) if isinstance(rec.get("request"), dict) \
            else (rec, rec.get("response"))
        refused = http_error(response)
        if refused is not None:
            src.skip(lineno, f"{refused}: not a model call")
            continue
        if isinstance(response, dict) and isinstance(response.get("body"), dict):
            response = response["body"]
        try:
            call = from_request(body, response)
        except ValueError as exc:
            src.skip(lineno, str(exc))
            continue
        call["source"] = src.where(lineno)
        ts = rec.get("ts") or rec.get("timestamp")
        call["ts"] = float(ts) if isinstance(ts, (int, float)) else None
        sid = src.session_of(rec) if src.session_key else session_of(body, rec)
        call["session"] = sid or chain_session(chains, src.stem, call, body)
        yield call
