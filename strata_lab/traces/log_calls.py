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
from collections import OrderedDict
from typing import Any, Iterable, Sequence

from strata_lab.text.structure import mask_volatile

__all__ = ["FIELDS", "FIDELITIES", "new_call", "text_parts", "image_placeholder", "tool_call", "SessionChain",
           "CHAINING_RULE", "field_path", "parse_field_path"]

# ids: the log has the prompt token ids; messages: the chat messages (rendered with a template); text: the
# rendered prompt text (encoded with the tokenizer); lengths: only token counts (placeholder ids keep the reuse)
FIDELITIES = ("ids", "messages", "text", "lengths")

# id-level chaining (SessionChain.session_of_ids): sessions remembered, prefix-length granularity, and how many
# ids (characters for prompts logged as text) at the end of a session's first prompt a later call may differ in
ID_RECENT_SESSIONS = 1024
ID_BLOCK = 64
ID_SLACK = 16
TEXT_SLACK = 64

CHAINING_RULE = (
    "Sessions: a log field names the session where it has one (--session-key FIELD.PATH, else the reader's own: "
    "OpenAI session / session_id / metadata.session_id, Claude Code sessionId, Codex session id, OTel "
    "gen_ai.conversation.id, the session id inside Claude Code's metadata.user_id). Otherwise calls are chained "
    "by one rule, longest prefix over recent calls (not equality): a call joins the session of the recent call "
    "with which it shares the longest prefix that covers that session's start (the call need not extend it); "
    "with none, it starts a new session. Message-level logs compare whole messages (about the last million) "
    "and the start is the system messages and the first user turn; a system message is compared with its "
    "volatile parts masked (timestamps, dates, clock times, uuids and request ids, numbers), so a session whose "
    "system prompt carries the time stays one session. Id-level logs (vLLM, SGLang) compare token "
    f"ids (the last {ID_RECENT_SESSIONS} sessions, prefix lengths to within {ID_BLOCK} ids) and the start is the "
    f"session's first prompt except at most its last {ID_SLACK} ids (the generation prompt, which later calls "
    f"may render differently; {TEXT_SLACK} characters for vLLM prompts logged as text). So an edited history "
    "or a re-rendered reply stays in its session, and conversations that share only a system prompt do not "
    "merge. Id-level logs (and vLLM prompts logged as text) are compared unmasked: which ids spell a timestamp "
    "depends on the served model's vocabulary, which the log does not name, and a text prompt does not say "
    "where its system message ends. There a system prompt whose time changes on every call starts a new "
    "session on every call; give such a log a session field (--session-key) or log its messages.")
# every call has these keys (None when the log does not say)
FIELDS = ("ts", "session", "call", "model", "fidelity", "source", "format", "request_id",
          "system", "messages", "tools", "prompt_text", "prompt_ids", "prompt_len",
          "response_text", "response_reasoning", "response_tool_calls", "response_ids",
          "prompt_tokens", "completion_tokens", "cached_tokens", "cache_read_tokens", "cache_creation_tokens",
          "cache_breakpoints", "finish", "notes", "extra")

_FIELD_SET = frozenset(FIELDS)
_EMPTY_CALL = dict.fromkeys(FIELDS)  # (copied per call: cheaper than building it)

IMAGE_PLACEHOLDER = "[image]"


def new_call(**fields: Any) -> dict:
    """A call dict with every field present; unknown names are an error (a reader bug, not bad input)."""
    if not _FIELD_SET.issuperset(fields):
        raise TypeError(f"unknown call fields: {sorted(set(fields) - _FIELD_SET)}")
    call = _EMPTY_CALL.copy()
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


def _stable_system(messages: Sequence[dict]) -> Sequence[dict]:
    """`messages` with the volatile parts of its leading system messages masked (`mask_volatile`: a
    timestamp, a date, a request id), so that a session whose system prompt carries the time still chains; a
    new list only where a system message changes (the caller's messages are never changed)."""
    out = None
    for i, m in enumerate(messages):
        if m.__class__ is not dict or m.get("role") not in ("system", "developer"):
            break
        content = m.get("content")
        if content.__class__ is not str:
            continue
        masked = mask_volatile(content)
        if masked != content:
            if out is None:
                out = list(messages)
            out[i] = {**m, "content": masked}
    return messages if out is None else out


class SessionChain:
    """Derives session keys for logs that carry none (`CHAINING_RULE`). Messages: every prefix of every call's
    prompt (and prompt + reply) is registered to its session, most recent first; a later call joins the
    session of its longest registered prefix if that prefix reaches the first non-system message. Ids: see
    `session_of_ids`."""

    def __init__(self, prefix: str, *, max_entries: int = 1 << 20):
        self.prefix = prefix
        self._seen: dict = {}  # prefix digest (int for messages, bytes for ids) -> session
        self._count = 0
        self._max = max_entries  # oldest digests go first: a session idle for a million messages starts anew
        # id-level chaining: per recent session (least recently active first) its latest call's block digests;
        # its first prompt's required prefix (length, digest); how many sessions require each length
        self._last: OrderedDict = OrderedDict()
        self._first_key: dict = {}
        self._firsts: dict = {}
        self._req_count: dict[int, int] = {}
        self._tick = 0
        self.digests: list = []  # the last session_of_messages call's prefix digests

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

    def session_of_messages(self, messages: Sequence[dict], reply: dict | None = None, *,
                            known: Sequence[int] = ()) -> str:
        """`known`: the digests of the leading messages (`digests` after an earlier call whose messages these
        are), so that a call hashes only the messages it adds. `digests` holds this call's after."""
        messages = _stable_system(messages)
        digests = list(known)
        h = digests[-1] if digests else 0
        for m in messages[len(digests):] if digests else messages:
            h = hash((h, _message_key(m)))
            digests.append(h)
        self.digests = digests
        # the shared prefix must reach the first message after the leading system messages
        need = 0
        for m in messages:
            if m.get("role") not in ("system", "developer"):
                break
            need += 1
        session, k = None, need - 1
        for k in range(len(digests) - 1, need - 1, -1):
            session = self._seen.get(digests[k])
            if session is not None:
                break
        if session is None:
            session, k = self._new(), need - 1
        seen, pop = self._seen, self._seen.pop
        for d in digests[k + 1:]:  # the matched prefix is registered already (to this session)
            pop(d, None)  # (`_claim`, inline)
            seen[d] = session
        if reply is not None:
            d = hash((h, _message_key(reply)))
            pop(d, None)
            seen[d] = session
        while len(seen) > self._max:
            del seen[next(iter(seen))]
        return session

    def session_of_ids(self, prompt_ids: Sequence[int], reply_ids: Iterable[int] = (), *,
                       slack: int = ID_SLACK) -> str:
        """The session of an id-level call (`CHAINING_RULE`): candidates are the recent sessions whose first
        prompt this one contains, all but at most its last `slack` ids (at least half of it); among them the
        one whose latest call (prompt + reply) shares the longest prefix with it (to within `ID_BLOCK` ids;
        ties: the most recent). None: a new session, whose first prompt is this one."""
        raw = array("q", prompt_ids).tobytes()
        n = len(raw) // 8
        wanted = {k for k in self._req_count if 0 < k <= n}
        wanted.update(range(ID_BLOCK, n + 1, ID_BLOCK))
        digests, h, at = {}, hashlib.blake2b(digest_size=16), 0
        for k in sorted(wanted):  # prefix digests, one streaming pass
            h.update(raw[8 * at: 8 * k])
            at = k
            digests[k] = h.copy().digest()
        blocks = [digests[k] for k in range(ID_BLOCK, n + 1, ID_BLOCK)]
        best, best_len = None, -1
        for k in self._req_count:
            d = digests.get(k)
            for session in self._firsts.get((k, d), ()) if d is not None else ():
                last = self._last[session][1]
                lo, hi = 0, min(len(last), len(blocks))  # chained digests: equal up to a point, then not
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if last[mid - 1] == blocks[mid - 1]:
                        lo = mid
                    else:
                        hi = mid - 1
                if lo > best_len or (lo == best_len and self._last[session][0] > self._last[best][0]):
                    best, best_len = session, lo
        session = best
        if session is None:
            session = self._new()
            req = n - min(slack, n // 2)
            h = hashlib.blake2b(digest_size=16)
            h.update(raw[: 8 * req])
            self._firsts.setdefault((req, h.digest()), []).append(session)
            self._req_count[req] = self._req_count.get(req, 0) + 1
            self._first_key[session] = (req, h.digest())
        # the latest call of the session: its prompt + reply, as block digests
        h = hashlib.blake2b(digest_size=16)
        h.update(raw[: 8 * (n // ID_BLOCK * ID_BLOCK)])
        rest = raw[8 * (n // ID_BLOCK * ID_BLOCK):] + array("q", reply_ids).tobytes()
        for i in range(0, len(rest) // (8 * ID_BLOCK) * 8 * ID_BLOCK, 8 * ID_BLOCK):
            h.update(rest[i: i + 8 * ID_BLOCK])
            blocks.append(h.copy().digest())
        self._tick += 1
        self._last.pop(session, None)
        self._last[session] = (self._tick, blocks)
        while len(self._last) > ID_RECENT_SESSIONS:  # the least recently active session is forgotten
            old = next(iter(self._last))
            del self._last[old]
            key = self._first_key.pop(old)
            self._firsts[key].remove(old)
            if not self._firsts[key]:
                del self._firsts[key]
            self._req_count[key[0]] -= 1
            if not self._req_count[key[0]]:
                del self._req_count[key[0]]
        return session
