"""One model call as every reader yields it (a dict with the `FIELDS` below), the conversion helpers readers
share (content parts, image placeholders, tool calls), the `--session-key` field lookup, and the session key for
logs that carry none (`CHAINING_RULE`).

>>> chain = SessionChain("openai")
>>> a = [{"role": "user", "content": "hi"}]
>>> chain.session_of_messages(a, {"role": "assistant", "content": "hello"})
'openai-1'
>>> chain.session_of_messages(a + [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}])
'openai-1'
>>> chain.session_of_messages([{"role": "user", "content": "other"}])
'openai-2'
>>> chain.session_of_messages(a + [{"role": "assistant", "content": "edited"}])  # an edited history stays
'openai-1'
"""
from __future__ import annotations

import hashlib
import json
from array import array
from collections import deque
from typing import Any, Iterable, Sequence

__all__ = ["FIELDS", "FIDELITIES", "new_call", "text_parts", "image_placeholder", "tool_call", "SessionChain",
           "CHAINING_RULE", "field_path", "parse_field_path"]

# ids: the log has the prompt token ids; messages: the chat messages (rendered with a template); text: the
# rendered prompt text (encoded with the tokenizer); lengths: only token counts (placeholder ids keep the reuse)
FIDELITIES = ("ids", "messages", "text", "lengths")

CHAINING_RULE = (
    "Sessions: a log field names the session where it has one (--session-key FIELD.PATH, else the reader's own: "
    "OpenAI session / session_id / metadata.session_id, Claude Code sessionId, Codex session id, OTel "
    "gen_ai.conversation.id, the session id inside Claude Code's metadata.user_id). Otherwise calls are chained: "
    "a call joins the session of the recent call (about the last million messages) with which it shares the "
    "longest message prefix, provided that prefix reaches past the system messages into the first user turn; "
    "else it starts a new session. Id-level logs (vLLM, SGLang) chain on ids: a call joins the session whose "
    "earlier prompt, or prompt + reply, is a prefix of its own.")
# every call has these keys (None when the log does not say)
FIELDS = ("ts", "session", "call", "model", "fidelity", "source", "format", "request_id",
          "system", "messages", "tools", "prompt_text", "prompt_ids", "prompt_len",
          "response_text", "response_reasoning", "response_tool_calls", "response_ids",
          "prompt_tokens", "completion_tokens", "cached_tokens", "cache_read_tokens", "cache_creation_tokens",
          "cache_breakpoints", "finish", "notes", "extra")

IMAGE_PLACEHOLDER = "[image]"


def new_call(**fields: Any) -> dict:
    """A call dict with every field present; unknown names are an error (a reader bug, not bad input)."""
    unknown = set(fields) - set(FIELDS)
    if unknown:
        raise TypeError(f"unknown call fields: {sorted(unknown)}")
    call = dict.fromkeys(FIELDS)
    call.update(fields)
    if call["notes"] is None:
        call["notes"] = []
    return call


def image_placeholder(notes: list) -> dict:
    if "image placeholder" not in notes:
        notes.append("image placeholder")
    return {"type": "text", "text": IMAGE_PLACEHOLDER}


def text_parts(content: Any, notes: list) -> Any:
    """OpenAI-shaped content: a string stays; a list keeps its text parts and turns images, audio and files into
    a ``[image]`` text placeholder (noted), so templates that accept text parts render it."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, dict):
        content = [content]
    if not isinstance(content, list):
        return json.dumps(content, ensure_ascii=False)
    out = []
    for part in content:
        if isinstance(part, str):
            out.append({"type": "text", "text": part})
        elif not isinstance(part, dict):
            continue
        elif part.get("type") in ("text", "input_text", "output_text") and isinstance(part.get("text"), str):
            out.append({"type": "text", "text": part["text"]})
        elif part.get("type") in ("image_url", "image", "input_image", "input_audio", "file", "document",
                                  "image_file"):
            out.append(image_placeholder(notes))
    return out


def tool_call(call_id: Any, name: Any, arguments: Any) -> dict:
    """An OpenAI tool call. Object arguments (Anthropic, Codex actions, OTel parts) stay objects: templates
    render them with their own ``tojson``, as servers do after parsing the arguments."""
    if arguments is None:
        arguments = {}
    elif not isinstance(arguments, (str, dict)):
        arguments = json.dumps(arguments, ensure_ascii=False)
    out = {"type": "function", "function": {"name": str(name or "tool"), "arguments": arguments}}
    if call_id:
        out["id"] = str(call_id)
    return out


def _message_key(m: dict) -> int:
    # loose identity: role, text, tool call names/arguments; wire details (None vs "", part lists) do not split.
    # Python's str hash is computed once per string object and is in-process only, like the session keys.
    content = m.get("content")
    if content.__class__ is not str:
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict)) if isinstance(content, list) \
            else ""
    calls = m.get("tool_calls")
    if calls:
        calls = tuple((c.get("function") or {}).get("name", "") + str((c.get("function") or {}).get("arguments", ""))
                      for c in calls if isinstance(c, dict))
    return hash((m.get("role"), content, calls or ()))


def parse_field_path(path: str | None) -> str | None:
    """A `--session-key` value: dotted field names; a clear error for an empty one."""
    if path is None:
        return None
    if not isinstance(path, str) or not path.strip() or any(not p for p in path.split(".")):
        raise ValueError(f"session_key: {path!r} is not a field path like metadata.session_id")
    return path


def field_path(rec: Any, path: str) -> Any:
    """The value at a dotted `path` in a JSON record, or None. Keys that themselves hold dots (OTel's
    ``attributes.gen_ai.conversation.id``) are found by trying the longest dotted key first.

    >>> field_path({"a": {"b.c": {"d": 1}}}, "a.b.c.d")
    1
    """
    parts = path.split(".")
    i = 0
    while i < len(parts):
        if not isinstance(rec, dict):
            return None
        for j in range(len(parts), i, -1):
            key = ".".join(parts[i:j])
            if key in rec:
                rec, i = rec[key], j
                break
        else:
            return None
    return rec if rec is None or isinstance(rec, (str, int, float)) and not isinstance(rec, bool) else str(rec)


class SessionChain:
    """Derives session keys for logs that carry none (`CHAINING_RULE`). Messages: every prefix of every call's
    prompt (and prompt + reply) is registered to its session, most recent first; a later call joins the
    session of its longest registered prefix if that prefix reaches the first non-system message. Ids: a call
    joins the session whose prompt (or prompt + reply) is a prefix of its own."""

    def __init__(self, prefix: str, *, recent_lengths: int = 256, max_entries: int = 1 << 20):
        self.prefix = prefix
        self._seen: dict = {}  # prefix digest (int for messages, bytes for ids) -> session
        self._count = 0
        self._max = max_entries  # oldest digests go first: a session idle for a million messages starts anew
        self._lengths: deque[int] = deque(maxlen=recent_lengths)  # id prompts: lengths worth probing

    def _remember(self, digest, session: str) -> None:
        self._seen.setdefault(digest, session)
        if len(self._seen) > self._max:
            del self._seen[next(iter(self._seen))]

    def _claim(self, digest, session: str) -> None:  # the most recent call owns a prefix
        self._seen.pop(digest, None)
        self._seen[digest] = session
        if len(self._seen) > self._max:
            del self._seen[next(iter(self._seen))]

    def _new(self) -> str:
        self._count += 1
        return f"{self.prefix}-{self._count}"

    def session_of_messages(self, messages: Sequence[dict], reply: dict | None = None) -> str:
        h = 0
        digests = []
        for m in messages:
            h = hash((h, _message_key(m)))
            digests.append(h)
        # the shared prefix must reach the first message after the leading system messages
        need = next((i for i, m in enumerate(messages) if m.get("role") not in ("system", "developer")),
                    len(messages))
        session, k = None, need - 1
        for k in range(len(digests) - 1, need - 1, -1):
            session = self._seen.get(digests[k])
            if session is not None:
                break
        if session is None:
            session, k = self._new(), need - 1
        for d in digests[k + 1:]:  # the matched prefix is registered already (to this session)
            self._claim(d, session)
        if reply is not None:
            self._claim(hash((h, _message_key(reply))), session)
        return session

    def session_of_ids(self, prompt_ids: Sequence[int], reply_ids: Iterable[int] = ()) -> str:
        raw = array("q", prompt_ids).tobytes()
        session = None
        for n in sorted(set(self._lengths), reverse=True):
            if n <= len(prompt_ids):
                session = self._seen.get(hashlib.blake2b(raw[: 8 * n], digest_size=16).digest())
                if session is not None:
                    break
        session = session or self._new()
        full = raw + array("q", reply_ids).tobytes()
        for data in (raw, full):
            self._remember(hashlib.blake2b(data, digest_size=16).digest(), session)
            self._lengths.append(len(data) // 8)
        return session
