"""HAR 1.2 captures (browser devtools, mitmproxy's HAR export, Charles): ``log.entries[]`` of
``POST …/chat/completions`` and ``POST …/messages``. The request body is the exact bytes the client sent, parsed
with key order kept (tool schemas render in the order the client sent them: key-order drift between clients is
visible). Responses may be JSON or a server-sent-event stream (assembled here; usage only if the stream carried
it); base64 bodies are decoded. The entries array is streamed, not loaded whole.
"""
from __future__ import annotations

import base64
import json
from typing import Iterator

from strata_lab.traces import anthropic, openai
from strata_lab.traces.log_calls import SessionChain
from strata_lab.traces.claude_code import parse_ts
from strata_lab.traces.openai import reply_message
from strata_lab.traces.source import Source

NAME = "har"
SESSION_KEY = True  # --session-key names a field of each record


def detect_head(head: bytes) -> bool:
    return b'"log"' in head[:4096] and b'"entries"' in head


def _sse_events(text: str) -> Iterator[dict]:
    for block in text.replace("\r\n", "\n").split("\n\n"):
        data = "".join(line[5:].lstrip() for line in block.split("\n") if line.startswith("data:"))
        if data and data != "[DONE]":
            try:
                event = json.loads(data)
            except json.JSONDecodeError:
                continue
            if isinstance(event, dict):
                yield event


def assemble_openai(text: str) -> dict:
    """A chat.completion from its chat.completion.chunk stream."""
    content, reasoning, calls, out = [], [], {}, {"choices": [{"message": {}}]}
    for ev in _sse_events(text):
        out["id"], out["model"] = ev.get("id", out.get("id")), ev.get("model", out.get("model"))
        if ev.get("usage"):
            out["usage"] = ev["usage"]
        for ch in ev.get("choices") or ():
            delta = ch.get("delta") or {}
            content.append(delta.get("content") or "")
            reasoning.append(delta.get("reasoning_content") or delta.get("reasoning") or "")
            for tc in delta.get("tool_calls") or ():
                slot = calls.setdefault(tc.get("index", 0), {"id": None, "function": {"name": "", "arguments": ""}})
                slot["id"] = tc.get("id") or slot["id"]
                fn = tc.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""
            if ch.get("finish_reason"):
                out["choices"][0]["finish_reason"] = ch["finish_reason"]
    msg = out["choices"][0]["message"]
    msg["content"] = "".join(content)
    if any(reasoning):
        msg["reasoning_content"] = "".join(reasoning)
    if calls:
        msg["tool_calls"] = [calls[k] for k in sorted(calls)]
    return out


def assemble_anthropic(text: str) -> dict:
    """A Message from its message_start / content_block_* / message_delta stream."""
    msg: dict = {"content": []}
    partial: dict[int, str] = {}
    for ev in _sse_events(text):
        kind = ev.get("type")
        if kind == "message_start":
            msg.update({k: v for k, v in (ev.get("message") or {}).items() if k != "content"})
        elif kind == "content_block_start":
            msg["content"].append(dict(ev.get("content_block") or {}))
        elif kind == "content_block_delta" and msg["content"]:
            block, delta = msg["content"][ev.get("index", len(msg["content"]) - 1)], ev.get("delta") or {}
            if delta.get("type") == "text_delta":
                block["text"] = block.get("text", "") + delta.get("text", "")
            elif delta.get("type") == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
            elif delta.get("type") == "input_json_delta":
                partial[ev.get("index", 0)] = partial.get(ev.get("index", 0), "") + delta.get("partial_json", "")
        elif kind == "message_delta":
            msg.update({k: v for k, v in (ev.get("delta") or {}).items()})
            msg["usage"] = {**(msg.get("usage") or {}), **(ev.get("usage") or {})}
    for i, raw in partial.items():
        try:
            msg["content"][i]["input"] = json.loads(raw) if raw else {}
        except (json.JSONDecodeError, IndexError):
            pass
    return msg


def _response_body(entry: dict) -> tuple[dict | None, bool]:
    content = (entry.get("response") or {}).get("content") or {}
    text = content.get("text")
    if not isinstance(text, str) or not text:
        return None, False
    if content.get("encoding") == "base64":
        text = base64.b64decode(text).decode("utf-8", "replace")
    streamed = "event-stream" in str(content.get("mimeType", "")) or text.lstrip().startswith(("data:", "event:"))
    if streamed:
        return text, True
    try:
        return json.loads(text), False
    except json.JSONDecodeError:
        return None, False


def read(src: Source) -> Iterator[dict]:
    chain = SessionChain(src.stem)
    chains: dict = {}
    for lineno, entry in src.array_items(key="entries"):
        req = entry.get("request") if isinstance(entry, dict) else None
        if not isinstance(req, dict) or req.get("method") != "POST":
            continue
        url = str(req.get("url", "")).split("?")[0]
        dialect = openai if url.endswith("/chat/completions") else anthropic if url.endswith("/messages") else None
        if dialect is None:
            continue  # other traffic in the capture
        status = (entry.get("response") or {}).get("status", 200)
        if isinstance(status, int) and status >= 400:
            src.skip(lineno, f"{url} answered HTTP {status}")
            continue
        try:
            body = json.loads((req.get("postData") or {}).get("text") or "")
            response, streamed = _response_body(entry)
            if streamed:
                response = assemble_openai(response) if dialect is openai \
                    else assemble_anthropic(response)
            call = dialect.from_request(body, response, fmt=NAME)
        except (json.JSONDecodeError, ValueError, AttributeError, TypeError, RecursionError) as exc:
            src.skip(lineno, f"{url}: {'nested too deeply' if isinstance(exc, RecursionError) else exc}")
            continue
        if streamed:
            call["notes"].append("streamed response")
        call["source"] = src.where(lineno)
        call["ts"] = parse_ts(entry.get("startedDateTime"))
        sid = src.session_of(entry) if src.session_key else None
        if sid is None and dialect is anthropic:  # Claude Code's user_id holds the session; a plain one a user
            sid = anthropic.session_of(body, {}) or anthropic.chain_session(chains, f"{src.stem}-anthropic", call,
                                                                            body)
        call["session"] = sid or chain.session_of_messages(call["messages"], reply_message(call))
        yield call
