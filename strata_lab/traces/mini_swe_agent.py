"""mini-swe-agent trajectories (``<instance_id>.traj.json``: one JSON object, ``json.dumps(indent=2)``):
``{"info": {"model_stats": {"instance_cost", "api_calls"}, "config", "mini_version", "exit_status",
"submission"}, "messages": [...], "trajectory_format": "mini-swe-agent-1" | "mini-swe-agent-1.1",
"instance_id"}`` (``run/utils/save.py`` ``save_traj`` in 1.x; ``agents/default.py`` ``serialize`` in 2.x).

``messages`` is the conversation as the agent sent it, so a call's prompt is every message before its reply
(``extra`` is never sent; ``exit`` messages end the run and are not sent either). Replies:

* an ``assistant`` message (1.x: ``{role, content, timestamp, extra.response}``, only role and content are
  sent; 2.x: litellm's message with ``tool_calls``, ``extra.actions``, ``extra.response``, ``extra.cost``);
* a ``user`` message with ``extra.interrupt_type == "FormatError"`` and ``extra.response`` (2.x keeps a reply
  it could not parse only there: the reply is not in the conversation that follows, noted);
* a Responses-API response object (``"object": "response"``: its ``output`` items are the reply; tool
  results are ``function_call_output`` items).

Per-call usage comes from ``extra.response.usage`` (``prompt_tokens``, ``completion_tokens``,
``prompt_tokens_details.cached_tokens``, Anthropic-style ``cache_read_input_tokens`` /
``cache_creation_input_tokens``; Responses-API ``input_tokens`` / ``input_tokens_details.cached_tokens``) and
the cost from ``extra.cost`` (kept in ``extra.cost``). 2.x tool-calling models send mini-swe-agent's one
``bash`` tool (`BASH_TOOL`, as ``models/utils/actions_toolcall.py`` defines it); it is not in the file.
One session per file: ``instance_id``, else the file name without ``.traj.json``.

>>> usage_fields({"prompt_tokens": 120, "completion_tokens": 9, "cache_read_input_tokens": 100})
{'prompt_tokens': 120, 'completion_tokens': 9, 'cached_tokens': 100, 'cache_read_tokens': 100}
"""
from __future__ import annotations

import os
import re
from typing import Iterator

from strata_lab.traces.log_calls import new_call, text_parts, tool_call
from strata_lab.traces.openai import convert_messages
from strata_lab.traces.source import Source
from strata_lab.traces.swe_agent import is_json_lines, load_document, lines_of, stats_fact

NAME = "mini-swe-agent"
_FIRST_KEY = re.compile(rb'\A(?:\xef\xbb\xbf)?\s*\{\s*"info"\s*:\s*\{')
_MARKS = (b'"trajectory_format": "mini-swe-agent', b'"trajectory_format":"mini-swe-agent', b'"mini_version"',
          b'"minisweagent.')
# the tool 2.x's tool-calling models send with every request (not written to the trajectory)
BASH_TOOL = {"type": "function", "function": {
    "name": "bash", "description": "Execute a bash command",
    "parameters": {"type": "object", "properties": {"command": {
        "type": "string", "description": "The bash command to execute"}}, "required": ["command"]}}}


def detect_source(src: Source, head: bytes) -> bool:
    """The first key is ``info`` and the file names mini-swe-agent: in its first 64 KiB (``mini_version``, a
    ``minisweagent.`` class) or its last 4 KiB (``trajectory_format``, written after the messages)."""
    if _FIRST_KEY.match(head) is None or is_json_lines(head):
        return False
    if any(m in head for m in _MARKS):
        return True
    with open(src.path, "rb") as f:
        f.seek(max(0, src.size - 4096))
        tail = f.read()
    return any(m in tail for m in _MARKS[:2])


def usage_fields(usage) -> dict:
    """A response's ``usage`` (litellm's chat completion, an Anthropic message, a Responses-API response) as
    call fields."""
    if not isinstance(usage, dict):
        return {}
    out = {}
    read = usage.get("cache_read_input_tokens")
    write = usage.get("cache_creation_input_tokens")
    if isinstance(usage.get("prompt_tokens"), int):
        out["prompt_tokens"] = usage["prompt_tokens"]
        out["completion_tokens"] = usage.get("completion_tokens")
    elif isinstance(usage.get("input_tokens"), int):
        details = usage.get("input_tokens_details")
        if isinstance(details, dict) or not (isinstance(read, int) or isinstance(write, int)):
            out["prompt_tokens"] = usage["input_tokens"]  # Responses API: input_tokens is the whole prompt
        else:  # an Anthropic message: input_tokens counts only what follows the cached part
            out["prompt_tokens"] = sum(c for c in (usage["input_tokens"], read, write) if isinstance(c, int))
        out["completion_tokens"] = usage.get("output_tokens")
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if isinstance(cached, int):
        out["cached_tokens"] = cached
    elif isinstance(read, int):
        out["cached_tokens"] = read
    if isinstance(read, int):
        out["cache_read_tokens"] = read
    if isinstance(write, int):
        out["cache_creation_tokens"] = write
    return out


def _reply_of_chat(response: dict) -> dict:
    """The assistant message of a chat completion (litellm's ``model_dump``)."""
    choices = response.get("choices") or []
    choice = choices[0] if choices and isinstance(choices[0], dict) else {}
    return dict(choice.get("message") or {}, role="assistant") if isinstance(choice.get("message"), dict) \
        else {"role": "assistant", "content": ""}


def _output_items(items, notes: list) -> dict:
    """Responses-API output items as one assistant message (text, reasoning summary, function calls)."""
    texts, reasoning, calls = [], [], []
    for item in items or ():
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "message":
            parts = text_parts(item.get("content"), notes)
            texts.append(parts if isinstance(parts, str) else "".join(p["text"] for p in parts or ()))
        elif kind == "reasoning":
            reasoning.extend(s.get("text", "") for s in item.get("summary") or () if isinstance(s, dict))
            if item.get("encrypted_content") and "encrypted reasoning" not in notes:
                notes.append("encrypted reasoning")
        elif kind == "function_call":
            calls.append(tool_call(item.get("call_id") or item.get("id"), item.get("name"), item.get("arguments")))
    msg = {"role": "assistant", "content": "".join(texts)}
    if reasoning and any(reasoning):
        msg["reasoning_content"] = "".join(reasoning)
    if calls:
        msg["tool_calls"] = calls
    return msg


def _wire(m: dict, version: str) -> dict | None:
    """A message as the agent sends it (None: not sent)."""
    if m.get("type") == "function_call_output":
        out = m.get("output")
        return {"role": "tool", "tool_call_id": m.get("call_id"), "content": out if isinstance(out, str) else ""}
    role = m.get("role")
    if role in (None, "exit"):
        return None
    if version == "1":  # 1.x sends role and content only
        return {"role": role, "content": m.get("content")}
    return {k: v for k, v in m.items() if k not in ("extra", "timestamp", "type")}


def read(src: Source) -> Iterator[dict]:
    doc = load_document(src, ("messages",))
    if doc is None:
        return
    info = doc.get("info") if isinstance(doc.get("info"), dict) else {}
    messages = doc.get("messages")
    if not isinstance(messages, list):
        src.why_none = "messages: not a list in this mini-swe-agent trajectory"
        return
    fmt = str(doc.get("trajectory_format") or "")
    version = "1" if fmt == "mini-swe-agent-1" else "2"
    config = info.get("config") if isinstance(info.get("config"), dict) else {}
    model_cfg = config.get("model") if isinstance(config.get("model"), dict) else {}
    model = model_cfg.get("model_name") if isinstance(model_cfg.get("model_name"), str) else None
    model_type = str(config.get("model_type") or "")
    textbased = "textbased" in model_type.lower()
    base = os.path.basename(src.path)
    stem = base[: -len(".traj.json")] if base.endswith(".traj.json") else src.stem
    session = str(doc.get("instance_id") or stem)
    history: list[dict] = []
    count, cost = 0, 0.0
    for lineno, m in zip(lines_of(doc, "messages"), messages):
        if not isinstance(m, dict):
            src.skip(lineno, "message is not an object")
            continue
        extra = m.get("extra") if isinstance(m.get("extra"), dict) else {}
        response = extra.get("response") if isinstance(extra.get("response"), dict) else None
        notes: list = []
        if m.get("object") == "response":
            reply, response = _output_items(m.get("output"), notes), m
        elif m.get("role") == "assistant":
            wire = _wire(m, version)
            reply = convert_messages([wire], notes)[0]
        elif extra.get("interrupt_type") == "FormatError" and response is not None:
            reply = convert_messages([_reply_of_chat(response)], notes)[0] if "choices" in response \
                else _output_items(response.get("output"), notes)
            notes.append("format error: the reply is not in the conversation that follows")
        else:
            wire = _wire(m, version)
            if wire is not None:
                history.append(wire)
            continue
        try:
            prompt = convert_messages(history, notes)
        except ValueError as exc:
            src.skip(lineno, f"messages: {exc}")
            prompt = None
        if prompt is not None:
            tools = None
            if version == "2" and not textbased and m.get("object") != "response":
                tools = [BASH_TOOL]
                notes.append("tool definitions not in the file: mini-swe-agent's bash tool")
            elif m.get("object") == "response":
                notes.append("tool definitions not in the file")
            if response is None:
                notes.append("no extra.response: usage not in the file")
            content = reply.get("content")
            call = new_call(format=NAME, fidelity="messages", session=session, source=src.where(lineno),
                            model=(response or {}).get("model") or model, messages=prompt, tools=tools,
                            request_id=(response or {}).get("id"), notes=notes,
                            response_text=content if isinstance(content, str) else
                            "".join(p.get("text", "") for p in content or () if isinstance(p, dict)),
                            response_reasoning=reply.get("reasoning_content"),
                            response_tool_calls=reply.get("tool_calls"),
                            **usage_fields((response or {}).get("usage")))
            ts = extra.get("timestamp", m.get("timestamp"))
            call["ts"] = float(ts) if isinstance(ts, (int, float)) and not isinstance(ts, bool) else None
            if response is not None:
                choices = response.get("choices") or []
                if choices and isinstance(choices[0], dict):
                    call["finish"] = choices[0].get("finish_reason")
            if isinstance(extra.get("cost"), (int, float)):
                call["extra"] = {"cost": float(extra["cost"])}
                cost += float(extra["cost"])
            count += 1
            yield call
        if m.get("object") == "response":
            history.extend({k: v for k, v in item.items() if k != "extra"} if item.get("type") != "function_call"
                           else {"role": "assistant", "content": None, "tool_calls": [
                               {"id": item.get("call_id"), "type": "function",
                                "function": {"name": item.get("name"), "arguments": item.get("arguments")}}]}
                           for item in m.get("output") or () if isinstance(item, dict)
                           and item.get("type") in ("message", "function_call"))
        else:
            wire = _wire(m, version)
            if wire is not None:
                history.append(wire)
    stats = info.get("model_stats")
    fact = stats_fact(stats, count, "info.model_stats")
    if fact:
        if cost and isinstance((stats or {}).get("instance_cost"), (int, float)):
            fact += f"; the calls' extra.cost sums to {cost:,.4f}"
        src.facts.append(fact)
    if not count:
        src.why_none = "a mini-swe-agent trajectory with no model reply in its messages"
