"""aider's ``--llm-history-file``: a text log aider appends to (``aider/io.py`` ``log_llm_history``) with, per
model call, the messages sent and the reply (``aider/coders/base_coder.py`` ``send``)::

    TO LLM 2025-01-31T10:00:00
    -------
    SYSTEM Act as an expert software developer.
    -------
    USER Change the greeting.
    LLM RESPONSE 2025-01-31T10:00:04
    ASSISTANT Here is the change:

Each message (``aider/utils.py`` ``format_messages``) starts with a ``-------`` line and writes every line of
its content as ``ROLE line``; a list content writes each part's fields as ``ROLE key: value`` (a text part's
later lines unprefixed, an image as ``ROLE Image_url URL: ...``), a legacy function call as ``ROLE Function
Call: {...}``. The reply is written as ``ASSISTANT line`` lines after ``LLM RESPONSE``.

What the log loses: trailing newlines and the kind of line break inside each message (``splitlines``), the
role of a message with empty content (no line is written: taken as the turn that alternates with the one
before, noted), images (a placeholder), usage, and the function definitions. One session per file (aider
appends every run of a project to the same file).

>>> parse_content([("USER", "type: text"), ("USER", "text: hello"), ("USER", "cache_control: {}")], [])
[{'type': 'text', 'text': 'hello'}]
"""
from __future__ import annotations

import ast
import re
from datetime import datetime
from typing import Iterator

from strata_lab.traces.log_calls import image_placeholder, new_call, tool_call
from strata_lab.traces.source import Source

NAME = "aider"
_HEADER = re.compile(r"^(TO LLM|LLM RESPONSE) (\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?)\s*$")
_ROLE = re.compile(r"^(SYSTEM|USER|ASSISTANT|TOOL|FUNCTION|DEVELOPER)(?: (.*)|)$", re.S)
_HEAD = re.compile(rb"\A(?:\xef\xbb\xbf)?\s*(?:TO LLM|LLM RESPONSE) \d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}")
_KEY = re.compile(r"^([A-Za-z_]+)(?: URL)?: ", re.S)
SEPARATOR = "-------"
LOSSES = "line breaks as the log writes them (trailing newlines not kept); usage not in the log"


def detect_head(head: bytes) -> bool:
    """The file starts with aider's ``TO LLM <timestamp>`` (or ``LLM RESPONSE``) header."""
    return _HEAD.match(head) is not None


def _ts(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def parse_content(lines: list[tuple[str | None, str]], notes: list):
    """A message's content from its (role prefix or None for an unprefixed line, rest) lines: a string, or the
    parts of a list content (written ``key: value`` per part field)."""
    prefixed = [rest for role, rest in lines if role is not None]
    is_list = len(prefixed) >= 2 and prefixed[0].startswith("type: ") and \
        _KEY.match(prefixed[1]) is not None and prefixed[1].split(":", 1)[0] != "type"
    if not is_list:
        return "\n".join(rest for _, rest in lines)
    parts: list[dict] = []
    key = None
    for role, rest in lines:
        if role is None:  # a later line of the value before it (aider prefixes only the first)
            if key == "text" and parts:
                parts[-1]["text"] += "\n" + rest
            continue
        m = _KEY.match(rest)
        if m is None:
            continue
        key, value = m.group(1), rest[m.end():]
        if key == "type":
            parts.append({"type": "text", "text": ""} if value == "text" else image_placeholder(notes))
        elif key == "text" and parts:
            parts[-1]["text"] = value
        elif key == "cache_control" and "cache_control marks (not modelled)" not in notes:
            notes.append("cache_control marks (not modelled)")
    return parts


def _message(role: str | None, lines: list, prev_role: str | None, notes: list) -> dict:
    calls = []
    body = []
    for r, rest in lines:
        if r is not None and rest.startswith("Function Call: "):
            try:
                fc = ast.literal_eval(rest[len("Function Call: "):])
            except (ValueError, SyntaxError):
                fc = None
            if isinstance(fc, dict):
                calls.append(tool_call(None, fc.get("name"), fc.get("arguments")))
                continue
        body.append((r, rest))
    if role is None:  # empty content: aider wrote no line, so no role
        role = "assistant" if prev_role in ("user", "system") else "user"
        if "a message with empty content (role not logged: alternation assumed)" not in notes:
            notes.append("a message with empty content (role not logged: alternation assumed)")
    msg = {"role": role, "content": parse_content(body, notes)}
    if calls:
        msg["tool_calls"] = calls
        if "function definitions not logged" not in notes:
            notes.append("function definitions not logged")
    return msg


class _Call:
    def __init__(self, line: int, ts: float | None):
        self.line, self.ts = line, ts
        self.messages: list[dict] = []
        self.notes: list = []
        self.role: str | None = None  # the message being read
        self.lines: list = []
        self.open = False

    def close_message(self) -> None:
        if self.open:
            prev = self.messages[-1]["role"] if self.messages else None
            self.messages.append(_message(self.role, self.lines, prev, self.notes))
        self.role, self.lines, self.open = None, [], False


def _lines(src: Source) -> Iterator[tuple[int, str]]:
    """(line number, text) for every line, blank ones too (a text part's blank line is content)."""
    with open(src.path, "rb", buffering=1 << 20) as f:
        for lineno, raw in enumerate(f, 1):
            yield lineno, raw.decode("utf-8", "replace").rstrip("\r\n")


def read(src: Source) -> Iterator[dict]:
    call: _Call | None = None  # a TO LLM block being read (or waiting for its reply)
    reply: list[str] | None = None  # the reply lines, once LLM RESPONSE is seen
    stray = False  # in the lines of an LLM RESPONSE that has no TO LLM (skipped with it)

    def finish() -> dict | None:
        nonlocal call, reply
        if call is None:
            return None
        call.close_message()
        notes = call.notes + [LOSSES]
        if reply is None:
            notes.append("no LLM RESPONSE after it (the reply is not in the log)")
        out = new_call(format=NAME, fidelity="messages", session=src.stem, source=src.where(call.line),
                       ts=call.ts, messages=call.messages, notes=notes,
                       response_text="\n".join(reply) if reply is not None else None)
        if not out["messages"]:
            src.skip(call.line, "TO LLM block without messages")
            out = None
        call, reply = None, None
        return out

    for lineno, line in _lines(src):
        head = _HEADER.match(line)
        if head is not None:
            if head.group(1) == "TO LLM":
                done = finish()
                if done is not None:
                    yield done
                call = _Call(lineno, _ts(head.group(2)))
            else:
                if call is None or reply is not None:
                    done = finish()
                    if done is not None:
                        yield done
                    src.skip(lineno, "LLM RESPONSE without a TO LLM block before it (its lines too)")
                    stray = True
                    continue
                call.close_message()
                reply = []
            stray = False
            continue
        if call is None:
            if line.strip() and not stray:
                src.skip(lineno, "a line outside any TO LLM / LLM RESPONSE block")
            continue
        if reply is not None:
            m = _ROLE.match(line)
            reply.append(m.group(2) or "" if m is not None and m.group(1) == "ASSISTANT" else line)
            continue
        if line == SEPARATOR:
            call.close_message()
            call.open = True
            continue
        m = _ROLE.match(line)
        if not call.open:
            if m is None:
                src.skip(lineno, "a line before the first ------- of a TO LLM block")
                continue
            call.open = True
        if m is not None and (call.role is None or m.group(1).lower() == call.role):
            call.role = m.group(1).lower()
            call.lines.append((call.role.upper(), m.group(2) or ""))
        else:
            call.lines.append((None, line))
    done = finish()
    if done is not None:
        yield done
