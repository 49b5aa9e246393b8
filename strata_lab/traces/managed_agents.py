"""Claude Managed Agents session events (the agent sessions API: ``GET /v1/sessions/{id}/events`` or its stream,
saved one event per line, or one list page ``{"data": [events], ...}`` per line). Layout from the event types of
anthropics/anthropic-sdk-python ``src/anthropic/types/beta/sessions/beta_managed_agents_*_event.py``: every event
is ``{id, type, processed_at, ...}``.

Each ``span.model_request_start`` is one model call; its ``span.model_request_end`` (``model_request_start_id``)
carries the request's ``model_usage`` (``input_tokens``, ``cache_read_input_tokens``,
``cache_creation_input_tokens``, ``output_tokens``: Anthropic semantics, the prompt is the sum of the three input
counts). The prompt is the conversation the events show before the start: ``user.message`` and
``system.message`` turns, the agent's ``agent.message`` text and its tool calls (``agent.tool_use``,
``agent.mcp_tool_use``, ``agent.custom_tool_use``) as one assistant turn, and the results (``agent.tool_result``,
``agent.mcp_tool_result``, ``user.tool_result``, ``user.custom_tool_result``) as tool_result blocks, converted by
`strata_lab.traces.anthropic.convert_messages`; the reply is what the agent emits up to the next request.
Events cross-posted from a subagent thread (``session_thread_id`` set) belong to that thread's conversation and
are left out of this one (counted). After ``agent.thread_context_compacted`` the service summarised the history
and the events do not show the summary: later calls are length-only. ``session.usage`` snapshots (cumulative)
are kept as the file's own totals. The events hold neither the agent's system prompt nor its tool definitions
(noted on every call); ``agent.thinking`` is a progress signal without content.
"""
from __future__ import annotations

from typing import Iterator

from strata_lab.traces.anthropic import apply_usage, convert_messages
from strata_lab.traces.claude_code import parse_ts
from strata_lab.traces.log_calls import new_call
from strata_lab.traces.source import Source

NAME = "managed-agents"
NOT_LOGGED = "agent system prompt and tool definitions not in the events"
_KINDS = ("user", "agent", "session", "span", "system")
_TOOL_USE = ("agent.tool_use", "agent.mcp_tool_use", "agent.custom_tool_use")
_TOOL_RESULT = {"agent.tool_result": "tool_use_id", "agent.mcp_tool_result": "mcp_tool_use_id",
                "user.tool_result": "tool_use_id", "user.custom_tool_result": "custom_tool_use_id"}


def _is_event(rec) -> bool:
    kind = rec.get("type") if isinstance(rec, dict) else None
    return isinstance(kind, str) and kind.split(".", 1)[0] in _KINDS and "." in kind and "id" in rec


def detect(first: dict) -> bool:
    data = first.get("data")
    return _is_event(first) and ("processed_at" in first or first["type"].startswith("span.")) or (
        isinstance(data, list) and bool(data) and _is_event(data[0]))


def _events(src: Source) -> Iterator[tuple[int, dict]]:
    for lineno, rec in src.json_lines():
        if isinstance(rec.get("data"), list) and "type" not in rec:  # a list page
            for ev in rec["data"]:
                if isinstance(ev, dict):
                    yield lineno, ev
        else:
            yield lineno, rec


def _blocks(content, notes: list) -> list[dict]:
    out = []
    for b in content or ():
        if not isinstance(b, dict):
            continue
        if b.get("type") == "redacted":  # withheld by policy: the model saw something we cannot
            if "redacted content" not in notes:
                notes.append("redacted content")
            out.append({"type": "text", "text": "[redacted]"})
        elif b.get("type") == "search_result":
            out.append({"type": "text", "text": "\n".join(str(c.get("text", "")) for c in b.get("content") or ()
                                                          if isinstance(c, dict))})
        else:
            out.append(b)
    return out


def _convert(raw: list[dict], notes: list) -> list[dict]:
    """Raw Anthropic-shaped turns (and mid-conversation system turns) into OpenAI-shaped messages."""
    out: list[dict] = []
    run: list[dict] = []
    for m in raw:
        if m["role"] == "system":
            out.extend(convert_messages(run, notes))
            run = []
            out.append({"role": "system", "content": "".join(b.get("text", "") for b in m["content"])})
        else:
            run.append(m)
    out.extend(convert_messages(run, notes))
    return out


def read(src: Source) -> Iterator[dict]:
    raw: list[dict] = []          # the conversation so far
    pending: list[dict] = []      # calls begun, waiting for their end and their reply
    by_start: dict[str, dict] = {}
    compacted = False
    crossposted = 0
    usage_total: dict | None = None
    seen_notes: list = []         # what the conversation so far holds (redacted content)

    turn = [0]  # raw[turn[0]:] may be extended; a model request starts a new turn

    def add(role: str, blocks: list[dict]) -> None:
        if len(raw) > turn[0] and raw[-1]["role"] == role and role != "system":
            raw[-1]["content"].extend(blocks)
        else:
            raw.append({"role": role, "content": list(blocks)})

    def finish(entry: dict) -> dict | None:
        call = entry["call"]
        reply_blocks = [b for m in raw[entry["at"]:] if m["role"] == "assistant" for b in m["content"]]
        if reply_blocks:
            reply = convert_messages([{"role": "assistant", "content": reply_blocks}], call["notes"])[0]
            content = reply["content"]
            call["response_text"] = content if isinstance(content, str) else "".join(p["text"] for p in content)
            call["response_tool_calls"] = reply.get("tool_calls")
        if entry["error"]:
            src.skip(entry["line"], "model request ended in an error (is_error): not a model call")
            return None
        if call["fidelity"] == "lengths":
            if not isinstance(call["prompt_tokens"], int):
                src.skip(entry["line"], "model request after compaction without usage: nothing to measure")
                return None
            call["prompt_len"] = call["prompt_tokens"]
        return call

    def ready(final: bool = False) -> Iterator[dict]:
        while pending and (final or (pending[0]["ended"] and len(pending) > 1)):
            entry = pending.pop(0)
            by_start.pop(entry["call"]["request_id"], None)
            call = finish(entry)
            if call is not None:
                yield call

    for lineno, ev in _events(src):
        kind = ev.get("type")
        if not isinstance(kind, str):
            src.skip(lineno, "event without a type")
            continue
        if ev.get("session_thread_id") and kind.split(".", 1)[0] in ("agent", "user"):
            crossposted += 1  # a subagent thread's event surfaced on the primary stream
            continue
        notes: list = []
        if kind == "user.message":
            add("user", _blocks(ev.get("content"), notes))
        elif kind == "system.message":
            add("system", [b for b in ev.get("content") or () if isinstance(b, dict)])
        elif kind == "agent.message":
            add("assistant", _blocks(ev.get("content"), notes))
        elif kind in _TOOL_USE:
            add("assistant", [{"type": "tool_use", "id": ev.get("id"), "name": ev.get("name"),
                               "input": ev.get("input") or {}}])
        elif kind in _TOOL_RESULT:
            add("user", [{"type": "tool_result", "tool_use_id": ev.get(_TOOL_RESULT[kind]),
                          "content": _blocks(ev.get("content"), notes), "is_error": bool(ev.get("is_error"))}])
        elif kind == "agent.thread_context_compacted":
            compacted = True
            src.note(lineno, "context compacted: the summary is not in the events; later calls are length-only")
        elif kind == "span.model_request_start":
            call_notes = [NOT_LOGGED] + seen_notes
            call = new_call(format=NAME, session=src.stem, source=src.where(lineno), ts=parse_ts(ev.get("processed_at")),
                            request_id=ev.get("id"), notes=call_notes)
            if compacted:
                call["fidelity"] = "lengths"
                call_notes.append("history compacted by the service (summary not in the events): lengths only")
            else:
                call.update(fidelity="messages", messages=_convert(raw, call_notes))
                if not call["messages"]:
                    src.skip(lineno, "model request before any conversation event")
                    continue
            entry = {"call": call, "at": len(raw), "line": lineno, "ended": False, "error": False}
            turn[0] = len(raw)
            pending.append(entry)
            by_start[str(ev.get("id"))] = entry
        elif kind == "span.model_request_end":
            entry = by_start.get(str(ev.get("model_request_start_id")))
            if entry is None:
                src.skip(lineno, "span.model_request_end without its span.model_request_start")
                continue
            entry["ended"] = True
            entry["error"] = bool(ev.get("is_error"))
            apply_usage(entry["call"], ev.get("model_usage"))
        elif kind == "session.usage" and isinstance(ev.get("usage"), dict):
            usage_total = ev["usage"]
        for n in notes:
            if n not in seen_notes:
                seen_notes.append(n)
            for entry in pending:  # in the reply of a call not yet finished
                if n not in entry["call"]["notes"]:
                    entry["call"]["notes"].append(n)
        yield from ready()
    yield from ready(final=True)
    if crossposted:
        src.facts.append(f"{crossposted} events cross-posted from subagent threads (their own conversations): "
                         "not in this one")
    if usage_total is not None:
        src.facts.append("session.usage (cumulative): " + ", ".join(
            f"{k} {usage_total[k]}" for k in ("input_tokens", "cache_read_input_tokens", "output_tokens")
            if isinstance(usage_total.get(k), int)))
