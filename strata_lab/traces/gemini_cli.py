"""Gemini CLI chat recordings (``~/.gemini/tmp/<project hash>/chats/``; layout from google-gemini/gemini-cli
``packages/core/src/services/chatRecordingService.ts`` and ``chatRecordingTypes.ts``). Two shapes:

- ``session-<time>-<id>.jsonl`` (current): a metadata line ``{sessionId, projectHash, startTime, lastUpdated,
  kind}``, then one line per message write ``{id, timestamp, type, content, thoughts, tokens, model,
  toolCalls}`` (a message written again, with its tokens or tool calls, replaces the earlier copy in place),
  ``{"$rewindTo": id}`` (the conversation drops that message and all after it) and ``{"$set": {...}}``
  (metadata; with ``messages`` the whole conversation is replaced, as after compression). Subagents write
  ``<parent session id>/<id>.jsonl`` in the same shape (``kind: "subagent"``).
- ``session-<time>-<id>.json`` (older): one ``ConversationRecord`` document with every message in ``messages``.

Each ``gemini`` message the model wrote is one call (synthetic ones, without model or tokens, are not); its
prompt is the conversation before it, built as the Gemini ``contents`` the CLI sends (user parts; the model's
text and ``functionCall`` parts; the tool results as a user turn of ``functionResponse`` parts, taken from the
``toolCalls[].result`` where no user message holds them) and converted once by `strata_lab.traces.gemini`.
``info`` / ``error`` / ``warning`` messages are the CLI's own display, not conversation. Usage from ``tokens``:
``input`` is the whole prompt (``promptTokenCount``), ``cached`` the cache read, ``output`` the reply. The
recording holds neither the system prompt nor the tool definitions (noted on every call); thought summaries
(``thoughts``: subject and description) are the reply's reasoning, never re-sent.
"""
from __future__ import annotations

from typing import Iterator

from strata_lab.traces.claude_code import parse_ts
from strata_lab.traces.gemini import apply_usage, convert_contents, parts_of
from strata_lab.traces.log_calls import new_call
from strata_lab.traces.source import Source, loads

NAME = "gemini-cli"
NOT_LOGGED = "system prompt and tool definitions not in the log"


def detect(first: dict) -> bool:
    return isinstance(first.get("sessionId"), str) and "projectHash" in first


def detect_head(head: bytes) -> bool:
    """The older one-document shape (indented JSON): its first keys are sessionId and projectHash."""
    start = head.lstrip()[:4096]
    return start.startswith(b"{") and b'"projectHash"' in start and b'"sessionId"' in start


def _model_parts(rec: dict) -> list[dict]:
    parts = [p for p in parts_of(rec.get("content")) if not p.get("thought")]
    have = {(p["functionCall"].get("id"), p["functionCall"].get("name")) for p in parts
            if isinstance(p.get("functionCall"), dict)}
    for tc in rec.get("toolCalls") or ():
        if isinstance(tc, dict) and (tc.get("id"), tc.get("name")) not in have:
            parts.append({"functionCall": {"id": tc.get("id"), "name": tc.get("name"), "args": tc.get("args")}})
    return parts


def _result_parts(rec: dict, notes: list) -> list[dict]:
    out = []
    for tc in rec.get("toolCalls") or ():
        if not isinstance(tc, dict):
            continue
        got = parts_of(tc.get("result"))
        if not any("functionResponse" in p for p in got):
            if "tool result not recorded" not in notes:
                notes.append("tool result not recorded")
            got = [{"functionResponse": {"id": tc.get("id"), "name": tc.get("name"), "response": {}}}] + got
        out.extend(got)
    return out


def contents_of(records: list[dict], notes: list) -> list[dict]:
    """The Gemini ``contents`` the CLI sent for a conversation of recorded messages."""
    out: list[dict] = []
    results = None  # the tool results of the last model turn, until a user message holds them
    for rec in records:
        kind = rec.get("type")
        if kind == "user":
            parts = parts_of(rec.get("content"))
            if results and not any("functionResponse" in p for p in parts):
                out.append({"role": "user", "parts": results})
            results = None
            out.append({"role": "user", "parts": parts})
        elif kind == "gemini":
            if results:
                out.append({"role": "user", "parts": results})
            out.append({"role": "model", "parts": _model_parts(rec)})
            results = _result_parts(rec, notes) or None
    if results:
        out.append({"role": "user", "parts": results})
    return out


def _is_call(rec: dict) -> bool:
    return rec.get("type") == "gemini" and (bool(rec.get("model")) or isinstance(rec.get("tokens"), dict))


def _records(src: Source) -> Iterator[tuple[int, dict]]:
    """(line, record) in the order written; the older one-document shape gives its metadata then messages."""
    first = next(((n, line) for n, line in src.lines()), None)
    if first is None:
        return
    try:
        rec = loads(first[1])
    except ValueError:
        rec = None
    if isinstance(rec, dict) and not isinstance(rec.get("messages"), list):
        yield from src.json_lines()  # JSONL: the first line is the metadata
        return
    try:
        with open(src.path, "rb") as f:
            doc = loads(f.read())
    except ValueError as exc:
        src.skip(1, f"not valid JSON ({exc})")
        return
    if not isinstance(doc, dict) or not isinstance(doc.get("messages"), list):
        src.skip(1, "not a ConversationRecord (no messages list)")
        return
    yield 1, {k: v for k, v in doc.items() if k != "messages"}
    for i, m in enumerate(doc["messages"]):
        yield 1, m if isinstance(m, dict) else {"$bad": f"messages[{i}] is not an object"}


def read(src: Source) -> Iterator[dict]:
    meta: dict = {}
    msgs: dict[str, dict] = {}   # id -> latest copy, in conversation order
    where: dict[str, int] = {}   # id -> line of its latest copy
    pending: list[str] = []      # model messages not yet emitted (their copy may still be replaced)
    emitted: set[str] = set()
    synthetic = 0

    def flush() -> Iterator[dict]:
        order = list(msgs)
        for mid in pending:
            if mid not in msgs:
                continue
            k = order.index(mid)
            rec = msgs[mid]
            notes = [NOT_LOGGED]
            prompt = convert_contents(contents_of([msgs[i] for i in order[:k]], notes), notes)
            reply = convert_contents([{"role": "model", "parts": _model_parts(rec)}], notes)[0]
            thoughts = [f"{t.get('subject', '')}: {t.get('description', '')}".strip(": ")
                        for t in rec.get("thoughts") or () if isinstance(t, dict)]
            call = new_call(format=NAME, fidelity="messages", session=meta.get("sessionId") or src.stem,
                            source=src.where(where[mid]), ts=parse_ts(rec.get("timestamp")), model=rec.get("model"),
                            request_id=mid, messages=prompt, notes=notes,
                            response_text=reply["content"] if isinstance(reply["content"], str)
                            else "".join(p["text"] for p in reply["content"]),
                            response_reasoning="\n".join(thoughts) or None,
                            response_tool_calls=reply.get("tool_calls"))
            tokens = rec.get("tokens")
            if isinstance(tokens, dict):
                apply_usage(call, {"promptTokenCount": tokens.get("input"),
                                   "cachedContentTokenCount": tokens.get("cached"),
                                   "candidatesTokenCount": tokens.get("output")})
            if not prompt:
                if not isinstance(call["prompt_tokens"], int):
                    src.skip(where[mid], "model message with no conversation before it and no token counts")
                    continue
                call.update(fidelity="lengths", messages=None, prompt_len=call["prompt_tokens"])
                notes.append("conversation before it not in the log (rewound or replaced): lengths only")
            if meta.get("kind") == "subagent":
                notes.append("subagent session")
            emitted.add(mid)
            yield call
        pending.clear()

    def adopt(rec: dict, lineno: int) -> None:
        nonlocal synthetic
        mid = rec["id"]
        msgs[mid] = rec
        where[mid] = lineno
        if rec.get("type") == "gemini" and mid not in emitted and mid not in pending:
            if _is_call(rec):
                pending.append(mid)
            else:
                synthetic += 1

    for lineno, rec in _records(src):
        if "$bad" in rec:
            src.skip(lineno, rec["$bad"])
        elif isinstance(rec.get("$rewindTo"), str):
            yield from flush()
            order = list(msgs)
            cut = order.index(rec["$rewindTo"]) if rec["$rewindTo"] in msgs else 0
            for mid in order[cut:]:
                del msgs[mid]
            src.note(lineno, f"rewind: {len(order) - cut} messages dropped from the conversation that follows")
        elif isinstance(rec.get("$set"), dict):
            update = rec["$set"]
            if isinstance(update.get("messages"), list):
                yield from flush()
                msgs.clear()
                for m in update["messages"]:
                    if isinstance(m, dict) and isinstance(m.get("id"), str):
                        adopt(m, lineno)
            meta.update({k: v for k, v in update.items() if k != "messages"})
        elif isinstance(rec.get("id"), str):
            if rec["id"] not in msgs:
                yield from flush()  # a new message: the earlier ones are written whole
            adopt(rec, lineno)
        elif isinstance(rec.get("sessionId"), str):
            meta.update({k: v for k, v in rec.items() if k != "messages"})
            if isinstance(rec.get("messages"), list):  # the whole older record on one line
                for m in rec["messages"]:
                    if isinstance(m, dict) and isinstance(m.get("id"), str):
                        adopt(m, lineno)
        else:
            src.skip(lineno, "neither a message (id), metadata (sessionId), $set nor $rewindTo")
    yield from flush()
    if synthetic:
        src.facts.append(f"{synthetic} synthetic model messages (written by the CLI, not the model): not calls")
