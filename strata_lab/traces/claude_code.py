"""Claude Code session JSONL (``~/.claude/projects/<cwd>/<sessionId>.jsonl``; subagents in
``<sessionId>/subagents/agent-<id>.jsonl``): one line per event. Each assistant message (its lines share
``message.id``: one line per content block) is one model call; its prompt is the conversation before it. Hosted
cache ground truth per call: ``message.usage.cache_read_input_tokens`` / ``cache_creation_input_tokens``.

The log holds neither the system prompt nor the tool definitions (noted on every call); subagent
(``isSidechain``) lines form their own session ``<sessionId>/agent-<agentId>``; a line with no ``parentUuid``
after others (``/compact``) restarts the history.
"""
from __future__ import annotations

from collections import OrderedDict
from datetime import datetime
from typing import Iterator

from strata_lab.traces.anthropic import apply_usage, convert_messages
from strata_lab.traces.calls import new_call
from strata_lab.traces.source import Source

NAME = "claude-code"
_EVENT_TYPES = ("user", "assistant", "summary", "system", "file-history-snapshot", "queue-operation")
NOT_LOGGED = "system prompt and tool definitions not in the log"
# conversations whose history is kept at once; a file is one session plus its sidechains, so this bounds memory
# on concatenated logs without splitting real sessions (one evicted and seen again restarts, with a note)
MAX_OPEN_SESSIONS = 32


def detect(first: dict) -> bool:
    return first.get("type") in _EVENT_TYPES and ("sessionId" in first or "leafUuid" in first
                                                  or "messageId" in first or "uuid" in first)


def parse_ts(value) -> float | None:
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


class _Session:
    def __init__(self, key: str):
        self.key = key
        self.history: list[dict] = []
        self.pending: dict | None = None  # {"id", "prompt", "blocks", "line", "rec"}
        self.calls = 0


def _flush(s: _Session, src: Source) -> dict | None:
    p, s.pending = s.pending, None
    if p is None:
        return None
    notes: list = [NOT_LOGGED]
    if p["sidechain"]:
        notes.append("subagent sidechain")
    reply = convert_messages([{"role": "assistant", "content": p["blocks"]}], notes)[0]
    msg = p["rec"].get("message") or {}
    call = new_call(format=NAME, fidelity="messages", session=s.key, source=src.where(p["line"]),
                    ts=parse_ts(p["rec"].get("timestamp")), model=msg.get("model"), request_id=p["id"],
                    messages=p["prompt"], notes=notes, finish=msg.get("stop_reason"),
                    response_text=reply.get("content") if isinstance(reply.get("content"), str)
                    else "".join(x["text"] for x in reply.get("content") or ()),
                    response_reasoning=reply.get("reasoning_content"),
                    response_tool_calls=reply.get("tool_calls"))
    apply_usage(call, msg.get("usage"))
    s.history.append(reply)
    return call


def read(src: Source) -> Iterator[dict]:
    sessions: OrderedDict[str, _Session] = OrderedDict()
    closed: set[str] = set()
    for lineno, rec in src.json_lines():
        kind = rec.get("type")
        if kind not in ("user", "assistant"):
            continue  # summaries, snapshots, hooks: no model call
        msg = rec.get("message")
        if not isinstance(msg, dict):
            src.skip(lineno, f"{kind} line without a message object")
            continue
        sid = str(rec.get("sessionId") or "claude-code")
        sidechain = bool(rec.get("isSidechain"))
        key = f"{sid}/agent-{rec.get('agentId') or 'sidechain'}" if sidechain else sid
        s = sessions.get(key)
        if s is None:
            if key in closed:
                src.note(lineno, f"session {key} seen again after {MAX_OPEN_SESSIONS} others: its history restarts")
            s = sessions[key] = _Session(key)
            if len(sessions) > MAX_OPEN_SESSIONS:
                old_key, old = sessions.popitem(last=False)
                closed.add(old_key)
                done = _flush(old, src)
                if done is not None:
                    yield done
        else:
            sessions.move_to_end(key)
        if kind == "assistant":
            if msg.get("model") == "<synthetic>" or rec.get("isApiErrorMessage"):
                continue  # written by the client, not returned by the model
            mid = msg.get("id") or rec.get("uuid")
            content = msg.get("content")
            blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or ())
            if s.pending is not None and s.pending["id"] == mid:
                s.pending["blocks"].extend(blocks)
                s.pending["rec"] = rec  # the last line carries the final usage
                continue
            done = _flush(s, src)
            if done is not None:
                yield done
            s.pending = {"id": mid, "prompt": list(s.history), "blocks": blocks, "line": lineno, "rec": rec,
                         "sidechain": sidechain}
            continue
        done = _flush(s, src)
        if done is not None:
            yield done
        if rec.get("parentUuid") is None and s.history and not rec.get("isMeta"):
            s.history = []  # a new root: /compact or a resumed session starts over
        try:
            s.history.extend(convert_messages([{"role": "user", "content": msg.get("content")}], []))
        except ValueError as exc:
            src.skip(lineno, str(exc))
    for s in sessions.values():
        done = _flush(s, src)
        if done is not None:
            yield done
