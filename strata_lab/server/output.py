"""From generated ids to what a client sees: UTF-8-safe text, reasoning, content and tool calls.

`TextStream` turns ids into text without ever splitting a character. `OutputParser` routes that text:
`<think>...</think>` to reasoning, `<tool_call>{json}</tool_call>` to tool calls, the rest to content.
Tags may arrive whole (Qwen's added tokens) or in pieces; a partial tag is held back until it resolves.
Malformed tool-call JSON comes back as plain content, never as an error.

The parser can be primed with the assistant text already in the prompt (the assistant prefix, a
template-opened `<think>`): that sets its state but is never emitted.

>>> p = OutputParser()
>>> p.feed("<think>hmm</think>Hi <tool_call>") + p.feed('{"name": "f", "arguments": {"x": 1}}</tool_call>')
[Event(kind='reasoning', text='hmm', call=None), Event(kind='content', text='Hi ', call=None), Event(kind='tool_call', text='', call=ToolCall(name='f', arguments={'x': 1}))]
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable

from strata_lab.text.stream import TextStream

__all__ = ["TextStream", "OutputParser", "Event", "ToolCall", "parse_tool_call"]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_TAGS = (THINK_OPEN, THINK_CLOSE, CALL_OPEN, CALL_CLOSE)


class StopMatcher:
    """Cuts generated text before the first stop sequence; holds back a tail that may start one.

    >>> m = StopMatcher(["END"])
    >>> m.push("hello E"), m.push("ND more"), m.hit
    ('hello ', '', 'END')
    >>> m = StopMatcher(["END"]); m.push("a E"), m.flush()
    ('a ', 'E')

    `include` (vLLM's include_stop_str_in_output) keeps the stop sequence in the text; `after` (vLLM's
    min_tokens) lets the first `after` pushes (one per generated id) through unlooked-at.

    >>> m = StopMatcher(["END"], include=True, after=1); m.push("END"), m.push("x END y"), m.hit
    ('END', 'x END', 'END')
    """

    def __init__(self, stops, *, include: bool = False, after: int = 0):
        self.stops = tuple(stops)
        self.hit: str | None = None
        self._held = ""
        self.include, self.after, self._pushes = include, after, 0

    def push(self, text: str) -> str:
        if self.hit is not None or not self.stops:
            return "" if self.hit is not None else text
        self._pushes += 1
        if self._pushes <= self.after:
            return text
        data = self._held + text
        found = [(data.find(s), s) for s in self.stops if s in data]
        if found:
            at, self.hit = min(found)
            self._held = ""
            return data[:at + (len(self.hit) if self.include else 0)]
        # keep the longest tail that is a proper prefix of a stop sequence
        keep = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(data)), keep, -1):
                if data.endswith(s[:k]):
                    keep = k
                    break
        self._held = data[len(data) - keep:] if keep else ""
        return data[:len(data) - keep]

    def flush(self) -> str:
        held, self._held = self._held, ""
        return "" if self.hit is not None else held


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict


@dataclass(frozen=True)
class Event:
    kind: str          # "reasoning" | "content" | "tool_call"
    text: str = ""
    call: ToolCall | None = None


def parse_tool_call(text: str) -> ToolCall | None:
    """The call in a `<tool_call>` body, or None when it is not `{"name": str, "arguments": object}`.

    >>> parse_tool_call(' {"name": "f", "arguments": "{}"} ')
    ToolCall(name='f', arguments={})
    >>> parse_tool_call('{"name": "f", "arguments": [1]') is None
    True
    """
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], args)


class OutputParser:
    """Routes generated text into reasoning, content and tool calls (see the module docstring)."""

    def __init__(self) -> None:
        self.state = "content"       # "content" | "reasoning" | "tool_call"
        self._held = ""              # text that may be the start of a tag
        self._call = ""              # body of the open tool call
        self._call_silent = 0        # chars of the open call (tag included) that came from the prompt
        self._silent = False

    @property
    def in_reasoning(self) -> bool:
        return self.state == "reasoning"

    def prime(self, assistant_text: str) -> None:
        """Read assistant text that is already in the prompt: set the state, emit nothing."""
        self._silent = True
        try:
            self.feed(assistant_text)
            if self._held:           # a tag cut by the prompt's end is not a tag
                self._emit_text(self._held)
                self._held = ""
        finally:
            self._silent = False

    def feed(self, text: str) -> list[Event]:
        """Events for the next piece of generated text."""
        out: list[Event] = []
        buf = self._held + text
        self._held = ""
        while buf:
            pos = buf.find("<")
            if pos < 0:
                out += self._emit_text(buf)
                break
            if pos:
                out += self._emit_text(buf[:pos])
                buf = buf[pos:]
            tag = next((t for t in _TAGS if buf.startswith(t)), None)
            if tag is not None:
                out += self._on_tag(tag)
                buf = buf[len(tag):]
            elif any(t.startswith(buf) for t in _TAGS):
                self._held = buf     # maybe a tag that continues in the next piece
                break
            else:
                out += self._emit_text("<")
                buf = buf[1:]
        return out

    def finish(self) -> list[Event]:
        """Events for whatever is left when generation ends (an unclosed call is parsed if it can be)."""
        out = self._emit_text(self._held) if self._held else []
        self._held = ""
        if self.state == "tool_call":
            out += self._close_call(closed=False)
        return out

    # --- internals --------------------------------------------------------------------------------
    def _emit_text(self, text: str) -> list[Event]:
        if not text:
            return []
        if self.state == "tool_call":
            self._call += text
            if self._silent:
                self._call_silent += len(text)
            return []
        if self._silent:
            return []
        return [Event(self.state, text)]

    def _on_tag(self, tag: str) -> list[Event]:
        if self.state == "tool_call":
            if tag == CALL_CLOSE:
                return self._close_call(closed=True)
            return self._emit_text(tag)     # tags inside a call body are part of its text
        if tag == THINK_OPEN and self.state == "content":
            self.state = "reasoning"
            return []
        if tag == THINK_CLOSE and self.state == "reasoning":
            self.state = "content"
            return []
        if tag == CALL_OPEN and self.state == "content":
            self.state, self._call = "tool_call", ""
            self._call_silent = len(CALL_OPEN) if self._silent else 0
            return []
        return self._emit_text(tag)         # a stray tag is text

    def _close_call(self, *, closed: bool) -> list[Event]:
        body, self.state = self._call, "content"
        call = parse_tool_call(body)
        silent, self._call, self._call_silent = self._call_silent, "", 0
        if self._silent:
            return []
        if call is not None:
            return [Event("tool_call", call=call)]
        # malformed: give the text back, less whatever of it the prompt already holds
        raw = CALL_OPEN + body + (CALL_CLOSE if closed else "")
        if silent > 0:
            raw = raw[silent:]
        return [Event("content", raw)] if raw else []


def collect(events: Iterable[Event]) -> tuple[str, str, list[ToolCall]]:
    """(reasoning, content, tool_calls) of a finished list of events."""
    reasoning, content, calls = [], [], []
    for ev in events:
        if ev.kind == "reasoning":
            reasoning.append(ev.text)
        elif ev.kind == "content":
            content.append(ev.text)
        else:
            calls.append(ev.call)
    return "".join(reasoning), "".join(content), calls
