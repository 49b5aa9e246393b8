"""OpenAI chat-completions logs: one JSON per line holding a request body, ``{"request", "response"}`` pairs, or
Batch API input lines (``{"custom_id", "method", "url", "body"}``). A response with vLLM's
``prompt_token_ids`` / ``choices[].token_ids`` (``return_token_ids``) gives the call its ids. An agent's log
resends each session's history with every call: a line is parsed only after the part of its ``messages`` that
a recent line already held (`SharedPrefixLines`), and messages are converted and chained only where they are
new (`RecentRequests`); the calls are those of reading every line whole (their leading messages are shared
objects: calls are read, not changed in place).

Why one module: the three line shapes, the shared-prefix parse and the chaining of recent requests decide
together which part of a line is new; kept apart, the parse could skip what the chaining still needs.

>>> call = from_request({"model": "m", "messages": [{"role": "user", "content": "hi"}]},
...                     {"choices": [{"message": {"content": "hello"}, "finish_reason": "stop"}],
...                      "usage": {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 0}}})
>>> call["response_text"], call["prompt_tokens"], call["cached_tokens"], call["fidelity"]
('hello', 9, 0, 'messages')
"""
from __future__ import annotations

import json
import random
import re
from collections import OrderedDict, deque
from typing import Iterator

from strata_lab.traces.log_calls import _EMPTY_CALL, SessionChain, text_parts, tool_call
from strata_lab.traces.dialect import http_error, looks_anthropic
from strata_lab.traces.source import Source, _DecodeError, loads

NAME = "openai"
SESSION_KEY = True  # --session-key names a field of each record
_ROLES = {"developer": "system", "function": "tool"}


def detect(first: dict) -> bool:
    body = first.get("body") if isinstance(first.get("body"), dict) else first.get("request", first)
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return False
    return not looks_anthropic(body, first.get("response"))


def convert_messages(messages: list, notes: list) -> list[dict]:
    """Wire messages into the internal shape (OpenAI's, text parts only, reasoning as reasoning_content)."""
    return _convert(messages, notes)[0]


def _convert(messages: list, notes: list, start: int = 0) -> tuple[list[dict], int]:
    """(the converted messages[start:], how many leading ones are plain: written without a note, from a message
    without numbers or booleans, so that an equal message converts the same: 1 == 1.0 == True, but str() and
    tojson write them apart). The common shapes are written here directly (as `_message` writes them), the rest
    by `_message`."""
    out = []
    plain = 0
    for m in messages[start:] if start else messages:
        if not isinstance(m, dict):
            raise ValueError(f"message must be an object, got {type(m).__name__}")
        role = m.get("role")
        content = m.get("content")
        if content.__class__ is str and len(m) <= 3:  # the common shapes, as the general path writes them
            if len(m) == 2 and (role == "user" or role == "system"):
                out.append({"role": role, "content": content})
                if plain == len(out) - 1:
                    plain += 1
                continue
            tcid = m.get("tool_call_id")
            if len(m) == 3 and role == "tool" and tcid.__class__ is str and tcid:
                out.append({"role": role, "content": content, "tool_call_id": tcid})
                if plain == len(out) - 1:
                    plain += 1
                continue
        mine: list = []
        out.append(_message(m, mine))
        if plain == len(out) - 1 and not mine and _no_numbers(m):
            plain += 1
        for n in mine:
            if n not in notes:
                notes.append(n)
    return out, plain


def _message(m: dict, notes: list) -> dict:
    role = _ROLES.get(m.get("role"), m.get("role"))
    msg = {"role": role}
    content = m.get("content")
    if content is not None and content.__class__ is not str:
        content = text_parts(content, notes)
    if content is not None:
        msg["content"] = content
    elif role != "assistant":
        msg["content"] = ""
    if role == "assistant":
        reasoning = m.get("reasoning_content") or m.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            msg["reasoning_content"] = reasoning
        calls = [tool_call(c.get("id"), (c.get("function") or {}).get("name"),
                           (c.get("function") or {}).get("arguments"))
                 for c in m.get("tool_calls") or () if isinstance(c, dict)]
        if calls:
            msg["tool_calls"] = calls
    if role == "tool":
        msg["tool_call_id"] = str(m.get("tool_call_id") or m.get("name") or "call")
    if isinstance(m.get("name"), str) and role in ("user", "system"):
        msg["name"] = m["name"]
    return msg


def _no_numbers(x) -> bool:
    """Whether a JSON value holds only strings, nulls, lists and objects (no number or boolean)."""
    c = x.__class__
    if c is dict:
        values = x.values()
    elif c is list:
        values = x
    else:
        return c is str or x is None
    for v in values:  # strings and nulls here, objects and lists in a call of their own
        c = v.__class__
        if not (c is str or v is None or ((c is dict or c is list) and _no_numbers(v))):
            return False
    return True


class RecentRequests:
    """The converted messages of recent requests, so that a request that resends an earlier one's messages (an
    agent's next call: its history, the reply, what comes next) converts only what it adds, and shares the
    earlier call's message objects for the rest (calls are read, not changed in place). The earlier request is
    the longest recent one with the same first message (and the first after the system prompt) that is a
    prefix of this one, compared as parsed JSON (in C); only its leading plain messages are taken (see
    `_convert`); with none, the most recent one's common leading messages. Bounded: `max_anchors` first
    messages, `per_anchor` requests each."""

    def __init__(self, max_anchors: int = 128, per_anchor: int = 2):
        self._by: OrderedDict = OrderedDict()  # anchor -> [_Seen, ...] (oldest first)
        self.last: _Seen | None = None
        self.max_anchors, self.per_anchor = max_anchors, per_anchor

    @staticmethod
    def _anchor(raw: list):
        first = raw[0] if raw[0].__class__ is dict else None
        if first is None:
            return None
        a = first.get("content")
        a = a if a.__class__ is str else None
        b = None
        if len(raw) > 1 and first.get("role") in ("system", "developer") and raw[1].__class__ is dict:
            b = raw[1].get("content")
            b = b if b.__class__ is str else None
        return (a, b)

    def convert(self, raw: list, notes: list, base: list | None = None) -> list[dict]:
        """The converted messages; `last` is this request's record after (the caller's chaining fills its
        `digests`). `base`: the messages list of an earlier line that `raw` starts with, the same objects
        (`SharedPrefixLines.base`); when it is the last request's, that request is the earlier one without a
        search (its leading plain messages are raw's; with two or more, the same anchor)."""
        last = self.last
        if base is not None and last is not None and last.raw is base and len(base) >= 2:
            anchor, best, k = last.anchor, last, last.plain
            seen = self._by.get(anchor) if anchor is not None else None
        else:
            anchor, best, k, seen = self._search(raw)
        if k:
            conv, plain = _convert(raw, notes, k)
            conv = best.conv[:k] + conv
            plain += k
        else:
            conv, plain = _convert(raw, notes)
        rec = _Seen(raw, conv, plain, best.digests[:k] if k and best.digests is not None else [], anchor)
        if anchor is not None:
            if seen is None:
                seen = self._by[anchor] = []
                if len(self._by) > self.max_anchors:
                    self._by.popitem(last=False)
            else:
                self._by.move_to_end(anchor)
            seen.append(rec)
            if len(seen) > self.per_anchor:
                del seen[0]
        self.last = rec
        return conv

    def _search(self, raw: list):
        """(anchor, the earlier request, how many leading messages it gives, the anchor's requests)."""
        anchor = self._anchor(raw) if raw else None
        seen = self._by.get(anchor) if anchor is not None else None
        best, k = None, 0
        if seen:
            for e in seen:
                n = e.plain
                if k < n <= len(raw) and raw[n - 1] == e.raw[n - 1] and raw[:n] == e.raw[:n]:
                    best, k = e, n
            if best is None:  # an edited history: the most recent request's common leading messages
                e = seen[-1]
                lim = min(len(raw), e.plain)
                while k < lim and raw[k] == e.raw[k]:
                    k += 1
                best = e if k else None
        return anchor, best, k, seen


class _Seen:
    """One recent request: its wire messages, converted ones, leading plain ones, the chain digests of the
    leading converted messages it shares with the earlier request (`known`), and of all its converted messages
    once chained (`digests`; None: not chained)."""

    __slots__ = ("raw", "conv", "plain", "known", "digests", "anchor")

    def __init__(self, raw, conv, plain, known, anchor):
        self.raw, self.conv, self.plain, self.known, self.anchor = raw, conv, plain, known, anchor
        self.digests = None


def apply_response(call: dict, response: dict | None) -> None:
    """Fill a call's reply and reported usage from a chat.completion (or a streamed one, assembled)."""
    if not isinstance(response, dict):
        return
    choices = response.get("choices") or []
    choice = choices[0] if choices and isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    content = message.get("content")
    call["response_text"] = content if isinstance(content, str) else None
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    call["response_reasoning"] = reasoning if isinstance(reasoning, str) else None
    calls = [tool_call(c.get("id"), (c.get("function") or {}).get("name"), (c.get("function") or {}).get("arguments"))
             for c in message.get("tool_calls") or () if isinstance(c, dict)]
    call["response_tool_calls"] = calls or None
    call["finish"] = choice.get("finish_reason")
    call["model"] = response.get("model") or call["model"]
    call["request_id"] = response.get("id") or call["request_id"]
    usage = response.get("usage") or {}
    call["prompt_tokens"] = usage.get("prompt_tokens")
    call["completion_tokens"] = usage.get("completion_tokens")
    details = usage.get("prompt_tokens_details") or {}
    call["cached_tokens"] = details.get("cached_tokens")
    if isinstance(response.get("prompt_token_ids"), list):  # vLLM return_token_ids
        call["prompt_ids"] = response["prompt_token_ids"]
        call["fidelity"] = "ids"
        if isinstance(choice.get("token_ids"), list):
            call["response_ids"] = choice["token_ids"]
    timings = response.get("timings")  # llama.cpp adds its timings to OpenAI responses
    if isinstance(timings, dict) and call["cached_tokens"] is None and isinstance(timings.get("cache_n"), int):
        call["cached_tokens"] = timings["cache_n"]


def from_request(body: dict, response: dict | None = None, *, fmt: str = NAME,
                 recent: RecentRequests | None = None, base: list | None = None) -> dict:
    """One call from a chat-completions request body (and its response, if logged). `recent`: converts only
    what the request adds to a recent one (the same messages); the request's record is `recent.last` after.
    `base`: see `RecentRequests.convert`."""
    notes: list = []
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise ValueError("messages: missing or empty")
    messages = recent.convert(body["messages"], notes, base) if recent is not None else \
        convert_messages(body["messages"], notes)
    call = _EMPTY_CALL.copy()  # (new_call's dict, filled in place: the fields are known)
    call["format"], call["fidelity"], call["model"], call["notes"], call["messages"] = \
        fmt, "messages", body.get("model"), notes, messages
    tools = body.get("tools")
    if tools:
        call["tools"] = [t for t in tools if isinstance(t, dict)] or None
    kwargs = body.get("chat_template_kwargs")  # vLLM/SGLang: e.g. {"enable_thinking": false}, reaches the template
    if isinstance(kwargs, dict) and kwargs:
        call["extra"] = {"chat_template_kwargs": kwargs}
    apply_response(call, response)
    return call


def _body(rec: dict) -> dict:
    """The request body of a record: a Batch API input line's ``body``, a pair's ``request``, or the record."""
    if isinstance(rec.get("body"), dict) and "custom_id" in rec:
        return rec["body"]
    if isinstance(rec.get("request"), dict):
        return rec["request"]
    return rec


_MESSAGES = re.compile(rb'"messages"[ \t\n\r]*:[ \t\n\r]*\[')
_WS_S = re.compile(r"[ \t\n\r]*")
_SEP = re.compile(rb"[ \t\n\r]*,")
_EMPTY = re.compile(rb"[ \t\n\r]*\]")
_NOT_UTF8 = object()


def _native_array_end():
    """`strata_lab._replay.json_array_end` (the end of a JSON array's elements, found in C++), or None without
    the compiled extension (then the json module's scanner finds it)."""
    from strata_lab._native import replay

    try:
        return replay().json_array_end
    except (ImportError, AttributeError):
        return None


class SharedPrefixLines:
    """The JSON records of a log's lines, as `Source.json_lines` gives them (the same values, the same skipped
    lines), parsing only what a line adds to a recent one: when a line's request ``messages`` array starts
    with the text of a recent line's whole array, element for element (an agent's next call resends its
    history, written the same way), those elements are not parsed again; the record takes that line's
    message objects (shared: records are read, not changed in place) and parses the rest.

    Exact: the line is parsed with a marker element in place of the shared ones; the marker must come out as
    the first message of the body the reader reads (so the text taken was that array's first elements, not a
    string or another field's), else the line is parsed whole. Identical text parses to identical values
    (number types, key order and all). Bounded: the arrays of the last `keep` lines that no later line
    extends (about one a session) are remembered."""

    def __init__(self, keep: int = 16):
        self._recent: deque = deque(maxlen=keep)  # (array text up to its last element's end, messages)
        self._nonce = random.getrandbits(62)
        self._marker = {"\u0000strata-lab-shared-prefix": self._nonce}
        self._marker_json = json.dumps(self._marker).encode()
        self._scan = json.scanner.make_scanner(json.JSONDecoder())
        self.shared = 0  # messages taken from earlier lines (all lines so far)
        self.base = None  # the last record's leading messages taken from an earlier line (that line's list)
        self._array_end = _native_array_end()

    def records(self, src: Source) -> Iterator[tuple[int, dict]]:
        for lineno, line in src.lines():
            rec = self._parse(line)
            if rec is None:
                rec = src.json_object(lineno, line)
            if rec is not None:
                yield lineno, rec

    def _parse(self, line: bytes) -> dict | None:
        """The record, or None: parse the line whole (and say what is wrong with it)."""
        self.base = None
        m = _MESSAGES.search(line)
        if m is None:
            return None
        a = m.end() - 1  # the array's "["
        base, rest, at = None, a + 1, 0
        for prev in reversed(self._recent):  # (a recent line's array text, as a view: no copy; its messages)
            at -= 1
            if line.startswith(prev[0], a):
                sep = _SEP.match(line, a + len(prev[0]))
                if sep is not None:  # the most recent line whose whole array this one's starts with
                    base, rest = prev, sep.end()
                    break
        if base is None and _EMPTY.match(line, rest) is not None:
            return None
        view = memoryview(line)
        try:
            rec = loads(b"".join((view[: a + 1], self._marker_json, b",", view[rest:])))
        except _DecodeError:
            return None
        body = _body(rec) if rec.__class__ is dict else None
        msgs = body.get("messages") if body is not None else None
        if msgs.__class__ is not list or not msgs or msgs[0] != self._marker:
            return None
        del msgs[0]
        if base is not None:
            body["messages"] = msgs = base[1] + msgs
            self.shared += len(base[1])
            self.base = base[1]
        # where this line's array ends, for the lines after it (its new elements scanned in C)
        if self._array_end is not None:
            got = self._array_end(line, rest)
            end, n = (None, 0) if got is None else (got[0] - rest, got[1])
        else:
            end, n = self._scan_tail(line, rest)
            if end is _NOT_UTF8:  # pragma: no cover - orjson read it: it is UTF-8
                return rec
        if end is not None and n + (len(base[1]) if base is not None else 0) == len(msgs):
            end += rest
            if base is not None:  # this line holds all of it: one entry a session
                del self._recent[at]
            self._recent.append((view[a:end], msgs))
        return rec

    def _scan_tail(self, line: bytes, rest: int):
        """(where the array's elements from line[rest:] end, relative to rest, in bytes; how many), or (None, 0);
        what `strata_lab._replay.json_array_end` does, with the json module's scanner."""
        try:
            tail = line[rest:].decode("utf-8")
        except UnicodeDecodeError:
            return _NOT_UTF8, 0
        pos, n, end = 0, 0, None
        try:
            while True:
                pos = self._scan(tail, _WS_S.match(tail, pos).end())[1]
                n += 1
                end = pos
                pos = _WS_S.match(tail, pos).end()
                c = tail[pos: pos + 1]
                if c == "]":
                    break
                if c != ",":
                    raise StopIteration
                pos += 1
        except (StopIteration, ValueError, RecursionError):
            return None, 0
        return (end if tail.isascii() else len(tail[:end].encode("utf-8"))), n


def read(src: Source) -> Iterator[dict]:
    chain = SessionChain(src.stem)
    recent = RecentRequests()
    lines = SharedPrefixLines()
    for lineno, rec in lines.records(src):
        body, response = rec, None
        batch_out = None
        if isinstance(rec.get("body"), dict) and "custom_id" in rec:  # Batch API input line
            body = rec["body"]
            if src.batch is not None:  # its output line, joined on custom_id
                batch_out = src.batch.pop(str(rec["custom_id"]), None)
                if batch_out is not None and batch_out[0] is None:
                    src.skip(lineno, f"custom_id {rec['custom_id']!r} failed in {batch_out[1]} ({batch_out[2]}): "
                                     "not a model call")
                    continue
                if batch_out is not None:
                    response = batch_out[0]
        elif isinstance(rec.get("request"), dict):
            body, response = rec["request"], rec.get("response")
        elif isinstance(rec.get("response"), dict) and "messages" in rec:
            response = rec["response"]
        refused = http_error(response) if response is not None and (
            response.__class__ is not dict or "status_code" in response or "status" in response
            or "error" in response or "type" in response or "body" in response) else None
        if refused is not None:
            src.skip(lineno, f"{refused}: not a model call")
            continue
        if isinstance(response, dict) and isinstance(response.get("body"), dict):  # batch output shape
            response = response["body"]
        try:
            call = from_request(body, response, recent=recent, base=lines.base)
        except ValueError as exc:
            src.skip(lineno, str(exc))
            continue
        seen = recent.last
        call["source"] = src.where(lineno)
        call["request_id"] = call["request_id"] or rec.get("custom_id")
        if batch_out is not None:
            call["notes"].append(f"usage and reply from {batch_out[1]}")
        elif "custom_id" in rec and src.batch is not None:
            call["notes"].append("no output line for this custom_id")
        ts = rec.get("ts") or rec.get("timestamp") or rec.get("created") or (response or {}).get("created")
        call["ts"] = float(ts) if isinstance(ts, (int, float)) else None
        sid = src.session_of(rec) if src.session_key else \
            rec.get("session") or rec.get("session_id") or (body.get("metadata") or {}).get("session_id")
        if sid:
            call["session"] = str(sid)
        else:
            call["session"] = chain.session_of_messages(call["messages"], reply_message(call),
                                                        known=seen.known)
            seen.digests, seen.known = chain.digests, None
        yield call


def reply_message(call: dict) -> dict | None:
    """The call's reply as the next request would resend it (for prefix-chaining)."""
    if call["response_text"] is None and not call["response_tool_calls"]:
        return None
    m = {"role": "assistant", "content": call["response_text"] or ""}
    if call["response_tool_calls"]:
        m["tool_calls"] = call["response_tool_calls"]
    return m
