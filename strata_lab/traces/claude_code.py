"""Claude Code session JSONL (``~/.claude/projects/<cwd>/<sessionId>.jsonl``; subagents in
``<sessionId>/subagents/agent-<id>.jsonl``): one line per event. Each assistant message (its lines share
``message.id``: one line per content block) is one model call; its prompt is the conversation before it. Hosted
cache ground truth per call: ``message.usage.cache_read_input_tokens`` / ``cache_creation_input_tokens``.

The log holds neither the system prompt nor the tool definitions (noted on every call). The conversation is
the ``parentUuid`` tree, not the file order: a call's prompt is the path from the root to its parent, so a
rewind (a message that continues from an earlier one) drops the abandoned branch (noted), and ``/compact``
(a ``compact_boundary`` line with no parent, then the summary) starts the history over. Subagent
(``isSidechain``) lines form their own sessions: ``<sessionId>/agent-<agentId>``, or, in versions that write no
``agentId`` (1.0.x, subagents inside the main file), ``<sessionId>/sidechain-<uuid of the subagent's first
line>`` — each subagent's chain of ``parentUuid`` apart, so concurrent subagents do not interleave. A
transcript may start with an assistant reply whose prompt is not in it (2.x subagent files): that call is
length-only (its usage), noted, and the calls after it are prompts that start at that reply.
"""
from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from datetime import datetime
from typing import Iterator

from strata_lab.traces.anthropic import apply_usage, convert_messages
from strata_lab.traces.log_calls import new_call
from strata_lab.traces.source import Source

NAME = "claude-code"
_EVENT_TYPES = ("user", "assistant", "summary", "system", "file-history-snapshot", "queue-operation")
NOT_LOGGED = "system prompt and tool definitions not in the log"
HEADLESS = "prompt not in the file (the transcript starts with this reply): lengths and usage only"
HEADLESS_AFTER = "the conversation's first prompt is not in the file: the prompt starts at the first reply"
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


class _Node:
    """One line in a session's parentUuid tree: user messages it adds, or the reply it is part of."""
    __slots__ = ("prev", "msgs", "reply")

    def __init__(self, prev, msgs=(), reply=None):
        self.prev, self.msgs, self.reply = prev, msgs, reply


def _history(node: _Node | None) -> list[dict]:
    out: list = []
    last = None
    while node is not None:
        if node.reply is not None:
            if node.reply is not last:
                out.append(node.reply)
                last = node.reply
        else:
            out.extend(reversed(node.msgs))
        node = node.prev
    out.reverse()
    return out


class _Session:
    def __init__(self, key: str):
        self.key = key
        self.nodes: dict[str, _Node] = {}
        self.cur: _Node | None = None    # the tip of the branch being followed
        self.history: list[dict] = []    # the messages on the path to `cur`
        self.pending: dict | None = None  # {"id", "prompt", "blocks", "line", "rec", "reply"}
        self.calls = 0
        self.headless = None  # a reply the file holds without its prompt (a subagent transcript's first line)

    def attach(self, rec: dict, node: _Node, src: Source, lineno: int, root: bool = False) -> None:
        """Hang a line's node under its parent (moving along the tree) and record it by uuid."""
        parent = rec.get("parentUuid")
        if root or (parent is None and not rec.get("isMeta")):
            prev = None  # a new root: the session start, /compact's boundary, a subagent's first prompt
        elif parent is None or parent not in self.nodes:
            prev = self.cur  # a meta line, or a parent this file does not hold: continue where we are
        else:
            prev = self.nodes[parent]
        node.prev = prev
        if prev is self.cur:
            if node.reply is not None:
                if not self.history or self.history[-1] is not node.reply:
                    self.history.append(node.reply)
            else:
                self.history.extend(node.msgs)
        else:
            old = self.history
            new = _history(node)
            keep = 0
            for a, b in zip(old, new):
                if a is not b:
                    break
                keep += 1
            if prev is not None and not any(m.get("role") == "assistant" for m in old[keep:]):
                # no model reply is left behind: siblings (tool results hung on their tool calls' lines), not a
                # rewind; the conversation holds both
                node.prev = self.cur
                self.history = old + [m for m in ((node.reply,) if node.reply is not None else node.msgs)]
            else:
                self.history = new
                if prev is not None and len(old) > keep:
                    src.note(lineno, f"rewind: continues from an earlier message; {len(old) - keep} messages of "
                                     "the abandoned branch are not in the prompts that follow")
        self.cur = node
        uuid = rec.get("uuid")
        if isinstance(uuid, str):
            self.nodes[uuid] = node


def _flush(s: _Session, src: Source) -> dict | None:
    p, s.pending = s.pending, None
    if p is None:
        return None
    notes: list = [NOT_LOGGED]
    if p["sidechain"]:
        notes.append("subagent sidechain")
    reply = convert_messages([{"role": "assistant", "content": p["blocks"]}], notes)[0]
    msg = p["rec"].get("message") or {}
    if p["prompt"] and p["prompt"][0] is s.headless:
        notes.append(HEADLESS_AFTER)
    call = new_call(format=NAME, fidelity="messages", session=s.key, source=src.where(p["line"]),
                    ts=parse_ts(p["rec"].get("timestamp")), model=msg.get("model"), request_id=p["id"],
                    messages=p["prompt"], notes=notes, finish=msg.get("stop_reason"),
                    response_text=reply.get("content") if isinstance(reply.get("content"), str)
                    else "".join(x["text"] for x in reply.get("content") or ()),
                    response_reasoning=reply.get("reasoning_content"),
                    response_tool_calls=reply.get("tool_calls"))
    apply_usage(call, msg.get("usage"))
    p["reply"].clear()
    p["reply"].update(reply)  # the later prompts that hold this reply see it whole
    if not p["prompt"]:  # the reply comes first: its prompt (the subagent's task) is not in the file
        s.headless = p["reply"]
        if not isinstance(call["prompt_tokens"], int):
            src.skip(p["line"], "an assistant reply whose prompt is not in the file, without usage: no call")
            return None
        call.update(fidelity="lengths", messages=None, prompt_len=call["prompt_tokens"])
        notes.append(HEADLESS)
    return call


def read(src: Source) -> Iterator[dict]:
    sessions: OrderedDict[str, _Session] = OrderedDict()
    closed: set[str] = set()
    side_root: dict[str, str] = {}  # sidechain line uuid -> uuid of its subagent's first line (no agentId)
    # finished calls wait here until no open call started before them: calls come out in the order they began
    ready: list = []
    seq = itertools.count()

    def done_line(call: dict) -> int:
        return int(call["source"].rsplit(":", 1)[1])

    def release(final: bool = False) -> Iterator[dict]:
        first_open = min((s.pending["line"] for s in sessions.values() if s.pending is not None), default=None)
        while ready and (final or first_open is None or ready[0][0] < first_open):
            yield heapq.heappop(ready)[2]

    for lineno, rec in src.json_lines():
        yield from release()
        kind = rec.get("type")
        if kind not in ("user", "assistant", "system", "attachment", "progress"):
            continue  # summaries, snapshots, queue operations: not in the tree
        sid = str(rec.get("sessionId") or "claude-code")
        sidechain = bool(rec.get("isSidechain"))
        root = False
        if not sidechain:
            key = sid
        elif rec.get("agentId"):
            key = f"{sid}/agent-{rec['agentId']}"
        else:  # 1.0.x: subagents share the file; each one's chain of parentUuid is its own session
            parent = rec.get("parentUuid")
            first = side_root.get(parent) if isinstance(parent, str) else None
            root = first is None
            first = first or str(rec.get("uuid") or lineno)
            if isinstance(rec.get("uuid"), str):
                side_root[rec["uuid"]] = first
            key = f"{sid}/sidechain-{first}"
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
                    heapq.heappush(ready, (done_line(done), next(seq), done))
        else:
            sessions.move_to_end(key)
        msg = rec.get("message")
        if kind in ("system", "attachment", "progress"):  # no message: a pass-through node of the tree
            if kind == "system" and rec.get("subtype") == "compact_boundary":
                done = _flush(s, src)
                if done is not None:
                    heapq.heappush(ready, (done_line(done), next(seq), done))
                s.attach(rec, _Node(None, []), src, lineno, root=True)
            elif isinstance(rec.get("uuid"), str):
                parent = rec.get("parentUuid")
                s.nodes[rec["uuid"]] = s.nodes.get(parent, s.cur) if isinstance(parent, str) else s.cur
            continue
        if not isinstance(msg, dict):
            src.skip(lineno, f"{kind} line without a message object")
            continue
        if kind == "assistant":
            if msg.get("model") == "<synthetic>" or rec.get("isApiErrorMessage"):
                # written by the client, not returned by the model: its children hang on its parent
                parent = rec.get("parentUuid")
                if isinstance(rec.get("uuid"), str):
                    s.nodes[rec["uuid"]] = s.nodes.get(parent, s.cur) if isinstance(parent, str) else s.cur
                continue
            mid = msg.get("id") or rec.get("uuid")
            content = msg.get("content")
            blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or ())
            if s.pending is not None and s.pending["id"] == mid:
                s.pending["blocks"].extend(blocks)
                s.pending["rec"] = rec  # the last line carries the final usage
                s.attach(rec, _Node(None, reply=s.pending["reply"]), src, lineno)
                continue
            done = _flush(s, src)
            if done is not None:
                heapq.heappush(ready, (done_line(done), next(seq), done))
            reply = {"role": "assistant", "content": ""}
            node = _Node(None, reply=reply)
            s.attach(rec, node, src, lineno, root=root)
            prompt = s.history[:-1] if s.history and s.history[-1] is reply else list(s.history)
            s.pending = {"id": mid, "prompt": prompt, "blocks": blocks, "line": lineno, "rec": rec,
                         "sidechain": sidechain, "reply": reply}
            continue
        done = _flush(s, src)
        if done is not None:
            heapq.heappush(ready, (done_line(done), next(seq), done))
        try:
            msgs = convert_messages([{"role": "user", "content": msg.get("content")}], [])
        except ValueError as exc:
            src.skip(lineno, str(exc))
            msgs = []
        s.attach(rec, _Node(None, msgs), src, lineno, root=root)
    for s in sessions.values():
        done = _flush(s, src)
        if done is not None:
            heapq.heappush(ready, (done_line(done), next(seq), done))
    yield from release(final=True)
